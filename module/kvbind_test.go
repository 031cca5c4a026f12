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

	"github.com/openai/openai-go/v3"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// tcpForward serves a held listener on 127.0.0.1 and forwards every
// connection to the address set later (the engine's, once it started).
type tcpForward struct {
	ln     net.Listener
	target atomic.Value // string
	wg     sync.WaitGroup
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
		tokenize_timeout 2s`, a, b)))
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
	ra, _ := k.x.Lookup(a)
	rb, _ := k.x.Lookup(b)

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
		st := k.x.Stats(rb)
		return st.Messages > 0 && !st.Healthy
	})
	// Engine A's feed turns fresh with its first event.
	eventually(t, "engine A's feed fresh", func() bool {
		direct(simA.URL(), i)
		i++
		return k.x.Fresh(ra)
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
	if st := k.x.Stats(rb); st.Fresh || k.x.BlockSizeMismatches() == 0 {
		t.Errorf("engine B: %+v, %d block size mismatches", st, k.x.BlockSizeMismatches())
	}
}
