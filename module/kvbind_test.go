package module

import (
	"github.com/ramjet-llm/ramjet/fleetstate"

	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/kvindex"
)

// tcpForward serves a held listener on 127.0.0.1 and forwards every
// connection to the address set later (the engine's, once it started).
// Without a target it accepts and closes at once.
type tcpForward struct {
	ln     net.Listener
	target atomic.Value // string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

// cut closes every forwarded connection and refuses new ones until a
// target is set again: a network path that breaks and comes back on the
// same address.
func (f *tcpForward) cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target.Store("")
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

// track registers c for cut (closing it at once if cut came first).
func (f *tcpForward) track(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if to, _ := f.target.Load().(string); to == "" {
		c.Close()
		return
	}
	f.conns = append(f.conns, c)
}

func newTCPForward(t *testing.T) *tcpForward {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &tcpForward{ln: ln}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer c.Close()
				to, _ := f.target.Load().(string)
				if to == "" {
					return
				}
				u, err := net.Dial("tcp", to)
				if err != nil {
					return
				}
				defer u.Close()
				f.track(c)
				f.track(u)
				done := make(chan struct{})
				go func() {
					io.Copy(u, c)
					u.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				io.Copy(c, u)
				c.(*net.TCPConn).CloseWrite()
				<-done
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return f
}

func (f *tcpForward) addr() string { return f.ln.Addr().String() }

// TestE2EKVBindMode is the precise path with ramjet binding the event
// socket and the engines' PUB sockets connecting to it (llm-d's setup,
// vLLM "endpoint": "tcp://<ramjet>:5557"), through the production
// directive (kv_bind, kv_topics) in a real Caddy, over real ZMQ and HTTP
// on 127.0.0.1: the engines are told apart by topic, requests are decided
// precisely and find their prefix cached, and an engine whose stores never
// land (its block size differs from kv_block_size) is reported in /health
// with the reason and routed by the estimate.
func TestE2EKVBindMode(t *testing.T) {
	// The Caddyfile names the engines before they start (they need the
	// address ramjet bound): forwarders hold their HTTP addresses.
	fa, fb := newTCPForward(t), newTCPForward(t)
	a, b := fa.addr(), fb.addr()
	c := startCaddyfile(t, directiveCaddyfile([]string{a, b}, fmt.Sprintf(`
		kv_bind tcp://127.0.0.1:0
		kv_topics %s=kv@a %s=kv@b
		tokenize_timeout 2s
		tokenize_wait always`, a, b)))
	k := liveKV(t)
	var bound string
	eventually(t, "ramjet bound its event socket", func() bool {
		bound = k.p.Subscriber().BoundAddr("tcp://127.0.0.1:0")
		return bound != ""
	})
	start := func(topic string, blockSize int) *enginesim.Server {
		sim, err := enginesim.Start(context.Background(), enginesim.Options{
			Instant: true, Model: "qwen3-8b",
			Engine:   engine.Config{BlockSize: blockSize, CapacityTokens: 4096 * 16},
			KVEvents: enginesim.KVEventsOptions{Endpoint: bound, Connect: true, Topic: topic},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Close() })
		return sim
	}
	simA := start("kv@a", 16)
	simB := start("kv@b", 32) // misconfigured: kv_block_size is 16
	fa.target.Store(simA.Addr())
	fb.target.Store(simB.Addr())
	cl := newClient(c)
	ra, _ := k.p.Index().Lookup(a)
	rb, _ := k.p.Index().Lookup(b)

	// Engine B's stores never land: sent to it directly (not through the
	// router, which may prefer A), until its feed is flagged.
	direct := func(url string, i int) {
		body := fmt.Sprintf(`{"model":"qwen3-8b","max_tokens":2,"messages":[{"role":"user","content":%q}]}`,
			longText(fmt.Sprintf("direct %d", i), 600))
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	i := 0
	eventually(t, "engine B's feed flagged", func() bool {
		direct(simB.URL(), i)
		i++
		st := k.p.Index().Stats(rb)
		return st.Messages > 0 && !st.Healthy
	})
	// Engine A's feed turns fresh with its first event.
	eventually(t, "engine A's feed fresh", func() bool {
		direct(simA.URL(), i)
		i++
		return k.p.Index().Fresh(ra)
	})

	resp, body := c.do(http.MethodGet, c.url("/health"), "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/health: %d %s", resp.StatusCode, body)
	}
	var rep fleetstate.HealthReport
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Replicas) != 2 || rep.Replicas[0].KV == nil || rep.Replicas[1].KV == nil {
		t.Fatalf("/health without the feeds: %s", body)
	}
	if kv := rep.Replicas[0].KV; !kv.Healthy || kv.Reason != "" {
		t.Errorf("engine A's feed in /health: %+v", kv)
	}
	if kv := rep.Replicas[1].KV; kv.Healthy || !strings.HasPrefix(kv.Reason, "stores_not_landing: ") || !rep.Replicas[1].Healthy {
		t.Errorf("engine B in /health: %+v (want usable, its feed unhealthy with the reason)", rep.Replicas[1])
	}
	t.Logf("/health: %s", body)

	// Conversations with their own system prompts (so that cold placement
	// spreads them): every decision is precise (A exactly, B by the
	// estimate), and a later turn on A finds its prefix cached.
	before := k.preciseN()
	idA := rep.Replicas[0].ID
	hits, onA := 0, 0
	const convs, turns = 12, 2
	for conv := range convs {
		msgs := []openai.ChatCompletionMessageParamUnion{systemMsg(longText(fmt.Sprintf("bind mode %d", conv), 2000))}
		for turn := range turns {
			msgs = append(msgs, userMsg(longText(fmt.Sprintf("conv %d turn %d", conv, turn), 300)))
			id, cached := kvChat(t, cl, "qwen3-8b", msgs)
			if turn > 0 && id == idA {
				onA++
				if cached > 0 {
					hits++
				}
			}
			msgs = append(msgs, openai.AssistantMessage("noted"))
		}
	}
	if got := k.preciseN() - before; got != convs*turns {
		t.Errorf("%d of %d decisions were precise", got, convs*turns)
	}
	if onA == 0 || hits != onA {
		t.Errorf("%d of %d later turns on A found cached tokens", hits, onA)
	}
	if st := k.p.Index().Stats(rb); st.Fresh || k.p.Index().BlockSizeMismatches() == 0 {
		t.Errorf("engine B: %+v, %d block size mismatches", st, k.p.Index().BlockSizeMismatches())
	}
}

// TestE2EKVBindReload: the precise path in bind mode through
// deploy/Caddyfile (RJ_KV_BIND on port 0: the system picks it, the engines
// are told it) across admin-API reloads, while clients stream through
// Caddy and the engines keep storing. A reload with the same config keeps
// the feeds as they are; one that changes a kv setting starts a new index
// whose subscriber takes over the very port the old one held (released
// first: the engines' PUB sockets redial the address they know), the
// engines reconnect, what they stored meanwhile is replayed (the new
// subscriber catches up from each engine's buffer) and the index agrees
// with the engines' cached_tokens; no request fails.
func TestE2EKVBindReload(t *testing.T) {
	fa, fb := newTCPForward(t), newTCPForward(t) // the engines' HTTP
	ra, rb := newTCPForward(t), newTCPForward(t) // their replay sockets
	a, b := fa.addr(), fb.addr()
	const bind = "tcp://127.0.0.1:0"
	d := loadDeployAdmin(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":         a + "," + b,
		"RJ_KV_BIND":          bind,
		"RJ_KV_TOPICS":        a + "=kv@a " + b + "=kv@b",
		"RJ_KV_REPLAY":        a + "=tcp://" + ra.addr() + " " + b + "=tcp://" + rb.addr(),
		"RJ_TOKENIZE_TIMEOUT": "2s",
	})
	k := liveKV(t)
	var bound string
	eventually(t, "ramjet bound its event socket", func() bool {
		bound = k.p.Subscriber().BoundAddr(bind)
		return bound != ""
	})
	var sims []*enginesim.Server
	for i, topic := range []string{"kv@a", "kv@b"} {
		sim, err := enginesim.Start(context.Background(), enginesim.Options{
			Instant: true, Model: "qwen3-8b",
			// Room for everything the clients store: the check below reads
			// a conversation stored before the reload.
			Engine: engine.Config{BlockSize: 16, CapacityTokens: 1 << 22},
			// One vLLM-like, one numbering from 1 with a topic frame in
			// its replay replies.
			KVEvents: enginesim.KVEventsOptions{Endpoint: bound, Connect: true, Topic: topic,
				ReplayEndpoint: "tcp://127.0.0.1:0", SeqFromOne: i == 1, ReplayTopic: i == 1},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Close() })
		sims = append(sims, sim)
	}
	fa.target.Store(sims[0].Addr())
	fb.target.Store(sims[1].Addr())
	ra.target.Store(strings.TrimPrefix(sims[0].KVReplayEndpoints()[0], "tcp://"))
	rb.target.Store(strings.TrimPrefix(sims[1].KVReplayEndpoints()[0], "tcp://"))
	model := sims[0].Model()

	// chat sends msgs straight to engine i (not through the router, which
	// may prefer the other) and returns the prompt's cached tokens.
	chat := func(i int, msgs string) int {
		t.Helper()
		return engineCached(t, sims[i].URL(), model, []byte(msgs))
	}
	user := func(s string) string { return fmt.Sprintf(`{"role":"user","content":%q}`, s) }
	fresh := func(k *kvState) bool {
		for _, up := range []string{a, b} {
			if r, ok := k.p.Index().Lookup(up); !ok || !k.p.Index().Fresh(r) {
				return false
			}
		}
		return true
	}
	n := 0
	eventually(t, "both feeds fresh", func() bool {
		for i := range sims {
			chat(i, "["+user(longText(fmt.Sprintf("warm-up %d", n), 300))+"]")
		}
		n++
		return fresh(k)
	})

	// The replicas are usable through Caddy (its first health checks ran
	// before the engines started).
	eventually(t, "a request through Caddy", func() bool {
		return streamOnce(context.Background(), http.DefaultClient, d.base, model, "ready?") == nil
	})
	var st trafficStats
	counts, stop := runClients(t, 4, &st, func(i int) streamClient {
		tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}
		c := &http.Client{Transport: tr, Timeout: 60 * time.Second}
		return streamClient{
			stream: func(ctx context.Context, k int) error {
				return streamOnce(ctx, c, d.base, model, longText(fmt.Sprintf("client %d request %d", i, k), 300))
			},
			close: tr.CloseIdleConnections,
		}
	})
	defer stop()
	everyClientAdvanced(t, counts, make([]int64, 4), 3)

	// The same config again: the same index and socket.
	before := counts()
	d.forceReload(t)
	everyClientAdvanced(t, counts, before, 3)
	if liveKV(t) != k || k.p.Subscriber().BoundAddr(bind) != bound {
		t.Fatalf("a reload with the same config replaced the kv state or its socket (bound %s, was %s)",
			k.p.Subscriber().BoundAddr(bind), bound)
	}

	// A changed kv setting: a new index and subscriber, on the same port.
	var m map[string]any
	if err := json.Unmarshal(d.cfg, &m); err != nil {
		t.Fatal(err)
	}
	if !setKV(m, "tokenize_timeout", "3s") {
		t.Fatal("no kv settings in the adapted config")
	}
	cfg, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// Stored by both engines before the reload, and through it.
	convs := make([]string, len(sims))
	for i := range sims {
		convs[i] = user(longText(fmt.Sprintf("stored on %d before the reload", i), 600))
		chat(i, "["+convs[i]+"]")
	}
	before = counts()
	d.cfg = cfg
	d.forceReload(t)
	k2 := liveKV(t)
	if k2 == k {
		t.Fatal("the kv state was kept across a change of tokenize_timeout")
	}
	eventually(t, "the new subscriber on the old port", func() bool { return k2.p.Subscriber().BoundAddr(bind) == bound })
	everyClientAdvanced(t, counts, before, 3)
	eventually(t, "the engines reconnected, caught up and fresh", func() bool {
		for i := range sims {
			chat(i, "["+user(longText(fmt.Sprintf("after the reload %d", n), 300))+"]")
		}
		n++
		return fresh(k2)
	})
	for i, up := range []string{a, b} {
		r, _ := k2.p.Index().Lookup(up)
		// The conversation stored before the reload, one turn on: the
		// new index has its blocks (replayed) and agrees with the engine.
		msgs := "[" + convs[i] + `,{"role":"assistant","content":"noted"},` + user("and then?") + "]"
		toks, err := k2.p.Tokenize(context.Background(), uint64(1000+i), kvindex.TokenizeRequest{Model: model, Messages: []byte(msgs)})
		if err != nil {
			t.Fatal(err)
		}
		out := make([]int, k2.p.Index().NumReplicas())
		k2.p.Index().Overlap(k2.p.Index().Keys(nil, 0, toks), out)
		if got := chat(i, msgs); got != out[r] || got == 0 {
			t.Errorf("%s after the reload: engine cached %d, index %d", up, got, out[r])
		}
		if s := k2.p.Index().Stats(r); !s.Complete || s.ReplayFailures != 0 || s.Fences != 0 {
			t.Errorf("%s: the new index does not mirror the engine: %+v", up, s)
		} else {
			t.Logf("%s: the new index: %d messages, %d of them replayed", up, s.Messages, s.Replayed)
		}
	}
	eventually(t, "the old feeds closed", func() bool {
		for _, s := range k.p.Index().AppendReplicaStats(nil) {
			if s.Connected {
				return false
			}
		}
		return true
	})
	stop()
	t.Logf("2 reloads: %d requests ok, %d failed; redials %d, %d", st.ok.Load(), st.failed.Load(), sims[0].KVRedials(), sims[1].KVRedials())
	if n := st.failed.Load(); n > 0 {
		t.Errorf("%d requests failed across the reloads; first: %s", n, strings.Join(st.errs, "; "))
	}
}

// setKV sets field name of the first "kv" object in the config tree m.
func setKV(m map[string]any, name string, v any) bool {
	for key, val := range m {
		switch x := val.(type) {
		case map[string]any:
			if key == "kv" {
				x[name] = v
				return true
			}
			if setKV(x, name, v) {
				return true
			}
		case []any:
			for _, e := range x {
				if em, ok := e.(map[string]any); ok && setKV(em, name, v) {
					return true
				}
			}
		}
	}
	return false
}
