package module

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/kvindex"
)

// The kv_events template over `dynamic srv`: deploy/k8s/base/Caddyfile
// with its precise-path lines uncommented, against the DNS stub. Every
// engine runs on 127.0.0.1, told apart by port: HTTP on p, its KV events
// on p+1 and its replay on p+2, so the template is
// tcp://{upstream.host}:{upstream.port+1}; {upstream.host} is the pod's
// DNS name, resolved through the stub (the block's resolvers).

// startKVSims starts n simulated engines publishing KV events. Each takes
// three consecutive ports p, p+1, p+2 (the template needs their relation,
// so port 0 cannot be asked for): p is drawn at random below the kernel's
// ephemeral range (no port another test got from port 0) and the engine
// binds all three itself; a port in use (a suite beside this one) fails
// that start, and another p is drawn. Nothing is probed and released.
func startKVSims(t *testing.T, n int) sims {
	t.Helper()
	out := make(sims, n)
	for i := range out {
		var err error
		for try := 0; try < 50; try++ {
			p := 20000 + 3*rand.IntN(4000) // 20000-31999
			var s *enginesim.Server
			s, err = enginesim.Start(context.Background(), enginesim.Options{
				Addr: fmt.Sprintf("127.0.0.1:%d", p), Model: "qwen3-8b", Instant: true,
				Engine: engine.Config{BlockSize: 16, CapacityTokens: 4096 * 16},
				KVEvents: enginesim.KVEventsOptions{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", p+1),
					ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", p+2), Topic: "kv-events"},
			})
			if err == nil {
				t.Cleanup(func() { s.Close() })
				out[i] = s
				break
			}
		}
		if out[i] == nil {
			t.Fatalf("engine %d: %v", i, err)
		}
	}
	return out
}

// kvTemplateBlock is what the test puts in place of the base Caddyfile's
// commented kv_events template.
const kvTemplateBlock = `depart_after 1s
				kv_events * tcp://{upstream.host}:{upstream.port+1} tcp://{upstream.host}:{upstream.port+2} {
					resolvers %s
				}
				kv_topic kv-events
				tokenize {
					timeout 5s
					wait always
				}`

// TestDynamicSRVKVTemplate: replicas discovered through `dynamic srv` get
// a KV event feed from the kv_events template when they join (routed by
// their exact overlap), lose it when they depart (the feed stops, their
// entries are dropped) and get a new one, cold, when they come back, with
// no failed request throughout.
func TestDynamicSRVKVTemplate(t *testing.T) {
	srvName := fmt.Sprintf("_http._tcp.kvt%d.engines.test.", time.Now().UnixNano())
	ss := startKVSims(t, 3)
	names := []string{"k0.engines.test.", "k1.engines.test.", "k2.engines.test."}
	key := func(i int) string { return fmt.Sprintf("%s:%d", names[i], srvPort(t, ss[i])) }
	stub := startDNSStub(t, srvName, "")
	set := func(idx ...int) { stub.serveEngines(t, names, ss, idx...) }
	set(0, 1)
	c := startK8sCaddy(t, stub, srvName, func(cf string) string {
		const commented = `# kv_events * tcp://{upstream.host}:5557 tcp://{upstream.host}:5558 {
				# 	# resolvers <dns server>
				# }`
		if !strings.Contains(cf, commented) {
			t.Fatal("deploy/k8s/base/Caddyfile has no commented kv_events template")
		}
		return strings.Replace(cf, commented, fmt.Sprintf(kvTemplateBlock, stub.addr), 1)
	})
	cl := newClient(c)
	k := liveKV(t)
	rep := func(i int) (kvindex.Replica, bool) { return k.p.Index().Lookup(key(i)) }
	fresh := func(i int) bool { r, ok := rep(i); return ok && k.p.Index().Fresh(r) }

	// freshAfterPokes waits until engine i's feed is fresh, asking the
	// engine itself (not through the router) for a completion while it is
	// not: a feed turns fresh on its engine's next event, and only a
	// request that engine serves makes one. Routing promises it none:
	// under load, k0 back in the answer got none of 20 s of background
	// traffic in two runs (engines' requests [3 1 111] and [16 160 3], k0's
	// all from before it left; its new feed connected, 0 messages), and
	// the test failed waiting for prompts that would reach it.
	freshAfterPokes := func(what string, i int) {
		t.Helper()
		direct := openai.NewClient(option.WithBaseURL(ss[i].URL()+"/v1/"), option.WithAPIKey("test"),
			option.WithMaxRetries(0), option.WithRequestTimeout(30*time.Second))
		pokes := 0
		if !poll(20*time.Second, func() bool {
			if fresh(i) {
				return true
			}
			pokes++
			kvChat(t, direct, "qwen3-8b", []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("%s poke %d", what, pokes), 400))})
			return fresh(i)
		}) {
			r, _ := rep(i)
			t.Fatalf("%s: feed not fresh after %d requests to its engine: %+v; engine %+v", what, pokes, k.p.Index().Stats(r), ss[i].Stats())
		}
	}

	// Warm-up: distinct prompts through the router until both feeds
	// delivered stores, at most 20 (the router may send them all to one),
	// then the engine of a feed still not fresh asked directly.
	for n := 0; n < 20 && (!fresh(0) || !fresh(1)); n++ {
		kvChat(t, cl, "qwen3-8b", []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("warm-up %d", n), 400))})
	}
	freshAfterPokes("warm-up k0", 0)
	freshAfterPokes("warm-up k1", 1)
	if n := k.p.TemplateFeeds(); n != 2 {
		t.Fatalf("%d template feeds, want 2", n)
	}

	// conversation runs turns of one conversation and reports its replica
	// and how many of its later turns were precise decisions with a cached
	// prefix on that replica.
	conversation := func(tag string, turns int) (home string, preciseWarm int) {
		t.Helper()
		msgs := []openai.ChatCompletionMessageParamUnion{systemMsg(longText(tag, 3000))}
		for turn := range turns {
			msgs = append(msgs, userMsg(longText(fmt.Sprintf("%s turn %d", tag, turn), 300)))
			before := k.preciseN()
			id, cached := kvChat(t, cl, "qwen3-8b", msgs)
			if turn == 0 {
				home = id
			} else if id == home && cached > 0 && k.preciseN() > before {
				preciseWarm++
			}
			msgs = append(msgs, openai.AssistantMessage("noted"))
		}
		return home, preciseWarm
	}
	routeOf := func(i int) string { return lookupFleet("").RouteID(key(i)) }

	// A replica joins: its feed starts, and conversations homed on it are
	// routed by its exact overlap.
	set(0, 1, 2)
	joined := time.Now()
	tick := func() { // the SRV answer is re-read on requests (after RJ_DNS_REFRESH)
		kvChat(t, cl, "qwen3-8b", []openai.ChatCompletionMessageParamUnion{userMsg("tick")})
	}
	eventually(t, "k2's template feed", func() bool { tick(); return k.p.TemplateFeeds() == 3 })
	feedAfter := time.Since(joined)
	onNew := false
	homes := map[string]int{}
	// New prefixes go where the router puts them, k2 about once in three
	// or more often (its cache is empty): the tries are counted, not
	// timed, so that a slow machine gets as many (at least 60, a miss
	// rate below (2/3)^60); and they go on for at least 35 s, past the
	// k8s Caddyfile's fail_duration 30s, in case passive health holds k2
	// out after a dial failed on a stalled machine.
	conv := 0
	for deadline := time.Now().Add(35 * time.Second); conv < 400 && !onNew && (conv < 60 || time.Now().Before(deadline)); conv++ {
		home, warm := conversation(fmt.Sprintf("joined %d", conv), 3)
		homes[home]++
		if home == routeOf(2) {
			onNew = true
			if warm != 2 {
				t.Errorf("conversation on the new replica: %d of 2 later turns precise and warm there", warm)
			}
		}
	}
	if !onNew {
		t.Fatalf("no conversation of %d homed on the new replica k2 %s in %v (fresh %v; homes %v; k0 %s, k1 %s): %+v",
			conv, routeOf(2), time.Since(joined), fresh(2), homes, routeOf(0), routeOf(1), k.p.Index().AppendReplicaStats(nil))
	}
	// The conversation's stores reach k2's feed after its answers, and a
	// subscription that joined as they were published (under load its
	// connection may come after the whole conversation) missed them: k2's
	// next event makes it fresh (a join replay catches up on the rest).
	freshAfterPokes("k2 joined", 2)
	t.Logf("k2 joined: its feed started %v after the SRV answer listed it; a conversation homed on it %v after", feedAfter, time.Since(joined))
	if n := kvGauge(t, "ramjet_kv_template_feeds"); n != 3 {
		t.Errorf("ramjet_kv_template_feeds = %v, want 3", n)
	}

	// Background traffic while k0 leaves and comes back; every failure
	// counts.
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
					Model:     "qwen3-8b",
					Messages:  []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("worker %d request %d", w, i), 200))},
					MaxTokens: openai.Int(2),
				}, option.WithRequestTimeout(30*time.Second))
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	stopTraffic := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopTraffic()

	// k0 leaves the answer: after depart_after its feed stops and its
	// entries are dropped.
	r0, _ := rep(0)
	if k.p.Index().Stats(r0).Entries == 0 {
		t.Fatal("k0 holds no entries before it leaves")
	}
	departed := k.p.Index().Fences(kvindex.FenceDeparted)
	set(1, 2)
	left := time.Now()
	eventually(t, "k0 departed", func() bool { _, ok := rep(0); return !ok && k.p.TemplateFeeds() == 2 })
	t.Logf("k0 left: its feed stopped and entries dropped %v after the SRV answer dropped it (depart_after 1s)", time.Since(left))
	if got := k.p.Index().Fences(kvindex.FenceDeparted); got != departed+1 {
		t.Errorf("departed fences %d, want %d", got, departed+1)
	}
	if st := k.p.Index().Stats(r0); st.Entries != 0 || st.Fresh || st.ID != "" {
		t.Errorf("k0's handle after departure: %+v", st)
	}
	if feeds := kvFeeds(lookupFleet("")); feeds[key(0)] != nil {
		t.Errorf("/health still lists k0's feed: %v", feeds)
	}

	// k0 comes back: a new feed under a new registration, which turns
	// fresh from its engine's events (the join replay rebuilds what the
	// engine still holds).
	set(0, 1, 2)
	back := time.Now()
	eventually(t, "k0's new feed", func() bool { _, ok := rep(0); return ok && k.p.TemplateFeeds() == 3 })
	freshAfterPokes("k0 back", 0)
	t.Logf("k0 back: fresh again %v after the SRV answer listed it", time.Since(back))
	stopTraffic()
	t.Logf("%d requests while k0 left and came back, %d failed; engines %v; precise %d approximate %d",
		sent.Load(), failed.Load(), ss.requests(), k.preciseN(), k.approxN())
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d requests failed; first: %v", n, sent.Load(), firstErr.Load())
	}

	// A reload of the same config keeps the precise path and its
	// template feeds, as static ones (kvStates keyed by the kv settings).
	resp, cfg := c.do(http.MethodGet, "http://"+c.admin+"/config/", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /config/: %s", resp.Status)
	}
	fences := k.p.Index().Fences(kvindex.FenceReconnect) + k.p.Index().Fences(kvindex.FenceDeparted)
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	if liveKV(t) != k || k.p.TemplateFeeds() != 3 {
		t.Fatalf("after a reload: kv state kept %v, template feeds %d", liveKV(t) == k, k.p.TemplateFeeds())
	}
	before := k.preciseN()
	kvChat(t, cl, "qwen3-8b", []openai.ChatCompletionMessageParamUnion{userMsg(longText("after the reload", 400))})
	if k.preciseN() != before+1 || k.p.Index().Fences(kvindex.FenceReconnect)+k.p.Index().Fences(kvindex.FenceDeparted) != fences {
		t.Errorf("after a reload: precise decisions +%d, fences +%d", k.preciseN()-before,
			k.p.Index().Fences(kvindex.FenceReconnect)+k.p.Index().Fences(kvindex.FenceDeparted)-fences)
	}
}

// kvGauge reads the unlabelled gauge name from the kv collector.
func kvGauge(t *testing.T, name string) float64 {
	t.Helper()
	m := collectorMetric(t, kvCollector(), name)
	if m == nil {
		t.Fatalf("no gauge %s", name)
	}
	return m.GetGauge().GetValue()
}

// TestKVTemplateCaddyfileHostShorthand: {host} in a Caddyfile is the
// request's host (the adapter rewrites it), so the template refuses it
// with the placeholder to write instead.
func TestKVTemplateCaddyfileHostShorthand(t *testing.T) {
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(`http://127.0.0.1:21090 {
	reverse_proxy 127.0.0.1:21091 {
		lb_policy ramjet {
			kv_events * tcp://{host}:5557
		}
	}
}`), nil)
	if err == nil || !strings.Contains(err.Error(), "write {upstream.host}") {
		t.Fatalf("adapting kv_events * tcp://{host}:5557: %v", err)
	}
}
