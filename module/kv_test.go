package module

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/kvindex"
)

func TestKVCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    *KVConfig
		wantErr string
	}{
		{
			name: "full",
			give: `ramjet {
				kv_events 127.0.0.1:8005 tcp://127.0.0.1:5557 tcp://127.0.0.1:5558 {
					ranks 2
				}
				kv_events 127.0.0.1:8006 tcp://127.0.0.1:5567
				kv_topic kv-events
				kv_block_size 32
				kv_max_entries 5000
				kv_predict_ttl 3s
				kv_canary qwen3-32b {
					interval 10s
					blocks 2
				}
				tokenize {
					timeout 200ms
					max_concurrent 8
					cache_entries 100
					url http://127.0.0.1:8005
				}
			}`,
			want: &KVConfig{
				Engines: []KVEngine{
					{Upstream: "127.0.0.1:8005", Events: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558", Ranks: 2},
					{Upstream: "127.0.0.1:8006", Events: "tcp://127.0.0.1:5567"},
				},
				Topic: "kv-events", BlockSize: 32, MaxEntries: 5000,
				PredictTTL: caddy.Duration(3 * time.Second), TokenizeTimeout: caddy.Duration(200 * time.Millisecond),
				TokenizeConcurrency: 8, TokenizeCache: 100, TokenizeURL: "http://127.0.0.1:8005",
				Canary: &KVCanary{Model: "qwen3-32b", Interval: caddy.Duration(10 * time.Second), Blocks: 2},
			},
		},
		{name: "no kv", give: `ramjet {
				alpha 2
			}`},
		{name: "tokenize alone", give: "ramjet {\n tokenize\n}", want: &KVConfig{}},
		{name: "kv_events args", give: "ramjet {\n kv_events 127.0.0.1:8005\n}", wantErr: "want <upstream> <events>"},
		{name: "kv_events twice", give: "ramjet {\n kv_events a:1 tcp://a:2\n kv_events a:1 tcp://a:3\n}",
			wantErr: "specified more than once"},
		{name: "ranks zero", give: "ramjet {\n kv_events a:1 tcp://a:2 {\n ranks 0\n }\n}", wantErr: "ranks must be positive"},
		{name: "ranks unknown", give: "ramjet {\n kv_events a:1 tcp://a:2 {\n rank 2\n }\n}", wantErr: "unrecognized option 'rank'"},
		{name: "topic twice", give: "ramjet {\n kv_topic a\n kv_topic b\n}", wantErr: "specified more than once"},
		{name: "bad ttl", give: "ramjet {\n kv_predict_ttl soon\n}", wantErr: "not a duration"},
		{name: "tokenize unknown", give: "ramjet {\n tokenize {\n retries 3\n }\n}", wantErr: "unrecognized option 'retries'"},
		{name: "canary without model", give: "ramjet {\n kv_canary\n}", wantErr: "want <model>"},
		{name: "canary unknown", give: "ramjet {\n kv_canary m {\n every 1s\n }\n}", wantErr: "unrecognized option 'every'"},
		{name: "unknown kv option", give: "ramjet {\n kv_everything 1\n}", wantErr: "unrecognized ramjet option 'kv_everything'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s RamjetSelection
			err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, s.KV); diff != "" {
				t.Errorf("kv (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKVConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		give    KVConfig
		wantErr string
	}{
		{"ok", KVConfig{Engines: []KVEngine{{Upstream: "a:1", Events: "tcp://a:2"}}}, ""},
		{"no engines", KVConfig{}, "engines must list"},
		{"no events", KVConfig{Engines: []KVEngine{{Upstream: "a:1"}}}, "upstream and events are required"},
		{"bad events", KVConfig{Engines: []KVEngine{{Upstream: "a:1", Events: "ipc:///x"}}}, "want tcp://host:port"},
		{"twice", KVConfig{Engines: []KVEngine{{Upstream: "a:1", Events: "tcp://a:2"}, {Upstream: "a:1", Events: "tcp://a:3"}}}, "listed twice"},
		{"canary model", KVConfig{Engines: []KVEngine{{Upstream: "a:1", Events: "tcp://a:2"}}, Canary: &KVCanary{}}, "canary.model is required"},
		{"negative ttl", KVConfig{Engines: []KVEngine{{Upstream: "a:1", Events: "tcp://a:2"}}, PredictTTL: -1}, "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.give
			c.setDefaults()
			err := c.validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// consecutivePorts returns a 127.0.0.1 port p such that p and p+1 were
// free a moment ago (vLLM offsets a data-parallel rank's ports by its
// rank).
func consecutivePorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		a.Close()
		if err == nil {
			b.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// startKVSim starts the engine simulator with two data-parallel ranks
// publishing KV events (and serving replays) on consecutive ports.
func startKVSim(t *testing.T) (*enginesim.Server, string, string) {
	t.Helper()
	// ZMQ binds the ports it is given: another process may take one after
	// consecutivePorts, so a start failing with EADDRINUSE is retried.
	var sim *enginesim.Server
	var events, replay string
	for attempt := 0; sim == nil; attempt++ {
		ev, rp := consecutivePorts(t), consecutivePorts(t)
		events, replay = fmt.Sprintf("tcp://127.0.0.1:%d", ev), fmt.Sprintf("tcp://127.0.0.1:%d", rp)
		var err error
		sim, err = enginesim.Start(context.Background(), enginesim.Options{
			Instant: true, DP: 2,
			Engine:   engine.Config{BlockSize: 16, CapacityTokens: 4096 * 16},
			KVEvents: enginesim.KVEventsOptions{Endpoint: events, ReplayEndpoint: replay, Topic: "kv-events"},
		})
		if err != nil && (attempt == 4 || !strings.Contains(err.Error(), "address already in use")) {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { sim.Close() })
	return sim, events, replay
}

func kvChat(t *testing.T, cl openai.Client, model string, msgs []openai.ChatCompletionMessageParamUnion) (string, int64) {
	t.Helper()
	var resp *http.Response
	c, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: model, Messages: msgs, MaxTokens: openai.Int(4),
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	return resp.Header.Get(HeaderUpstream), c.Usage.PromptTokensDetails.CachedTokens
}

func liveKV(t *testing.T) *kvState {
	t.Helper()
	kvLive.Lock()
	defer kvLive.Unlock()
	k := kvLive.m[DefaultStateKey]
	if k == nil {
		t.Fatal("no live kv state")
	}
	return k
}

func TestE2EKVPreciseRouting(t *testing.T) {
	sim, events, replay := startKVSim(t)
	addr := sim.Addr()
	c := startCaddy(t, []string{addr, addr}, proxyOpts{Policy: map[string]any{"kv": map[string]any{
		"engines":          []any{map[string]any{"upstream": addr, "events": events, "replay": replay, "ranks": 2}},
		"topic":            "kv-events",
		"tokenize_timeout": "2s",
	}}})
	cl := newClient(c)
	model := sim.Model()
	k := liveKV(t)

	// Until both feeds delivered an event the replicas are routed by the
	// estimate; warm-up requests make both ranks publish.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		r0, _ := k.x.Lookup(addr + "#0")
		r1, _ := k.x.Lookup(addr + "#1")
		if k.x.Fresh(r0) && k.x.Fresh(r1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("feeds never became fresh: %+v", k.x.AppendReplicaStats(nil))
		}
		// Distinct prompts longer than a block, so that the rendezvous
		// tie-break spreads them over both ranks.
		kvChat(t, cl, model, []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("warm-up %d", i), 400))})
	}
	before := k.precise.Load()

	// Conversations over two shared system prompts: every decision is made
	// precisely, each conversation stays where its cache is, and later
	// turns find their prefix cached.
	systems := []string{longText("billing", 3000), longText("shipping", 3000)}
	hits, turnsAfterFirst := 0, 0
	for conv := range 6 {
		msgs := []openai.ChatCompletionMessageParamUnion{systemMsg(systems[conv%2])}
		var first string
		for turn := range 3 {
			msgs = append(msgs, userMsg(longText(fmt.Sprintf("conv %d turn %d", conv, turn), 300)))
			id, cached := kvChat(t, cl, model, msgs)
			if turn == 0 {
				first = id
			} else {
				turnsAfterFirst++
				if id != first {
					t.Errorf("conversation %d turn %d moved from %s to %s", conv, turn, first, id)
				}
				if cached > 0 {
					hits++
				}
			}
			msgs = append(msgs, openai.AssistantMessage("noted"))
		}
	}
	if got := k.precise.Load() - before; got != 18 {
		t.Errorf("%d of 18 decisions were precise", got)
	}
	if hits != turnsAfterFirst {
		t.Errorf("%d of %d later turns found cached tokens", hits, turnsAfterFirst)
	}
	t.Logf("precise decisions %d, later turns with cached tokens %d/%d, index entries %d, tokenize cache hits %d",
		k.precise.Load()-before, hits, turnsAfterFirst, k.x.Entries(), k.tk.CacheHits())
	if n := k.tk.Fallbacks(kvindex.FallbackTimeout) + k.tk.Fallbacks(kvindex.FallbackError); n != 0 {
		t.Errorf("%d tokenize fallbacks", n)
	}

	// The metrics: stable names, lint-clean.
	if probs, err := testutil.CollectAndLint(kvCollector{}); err != nil || len(probs) > 0 {
		t.Errorf("lint: %v %v", err, probs)
	}
	const want = `
# HELP ramjet_kv_feed_fresh 1 when the replica's KV event feed is trusted and its exact overlap is used.
# TYPE ramjet_kv_feed_fresh gauge
`
	if n := testutil.CollectAndCount(kvCollector{}, "ramjet_kv_feed_fresh"); n != 2 {
		t.Errorf("%d ramjet_kv_feed_fresh series, want 2 (one per rank)%s", n, want)
	}
}

func TestE2EKVFeedDownFallsBack(t *testing.T) {
	sim, _, _ := startKVSim(t)
	addr := sim.Addr()
	dead := fmt.Sprintf("tcp://127.0.0.1:%d", consecutivePorts(t)) // nothing publishes there
	c := startCaddy(t, []string{addr, addr}, proxyOpts{Policy: map[string]any{"kv": map[string]any{
		"engines": []any{map[string]any{"upstream": addr, "events": dead, "ranks": 2}},
	}}})
	cl := newClient(c)
	k := liveKV(t)
	msgs := []openai.ChatCompletionMessageParamUnion{systemMsg(longText("fallback", 2000))}
	var first string
	for turn := range 4 {
		msgs = append(msgs, userMsg(fmt.Sprintf("question %d", turn)))
		id, _ := kvChat(t, cl, sim.Model(), msgs)
		if turn == 0 {
			first = id
		} else if id != first {
			t.Errorf("turn %d moved from %s to %s (the estimate keeps conversations together)", turn, first, id)
		}
		msgs = append(msgs, openai.AssistantMessage("ok"))
	}
	if k.precise.Load() != 0 || k.approx.Load() != 4 {
		t.Errorf("precise %d approximate %d, want 0 and 4", k.precise.Load(), k.approx.Load())
	}
}

func TestE2EKVCanary(t *testing.T) {
	sim, events, replay := startKVSim(t)
	addr := sim.Addr()
	c := startCaddy(t, []string{addr, addr}, proxyOpts{Policy: map[string]any{"kv": map[string]any{
		"engines": []any{map[string]any{"upstream": addr, "events": events, "replay": replay, "ranks": 2}},
		"topic":   "kv-events",
		"canary":  map[string]any{"model": sim.Model(), "interval": "150ms", "blocks": 2},
	}}})
	_ = c
	k := liveKV(t)
	// Each rank is probed every 300ms (time for the previous probe's events
	// to arrive); its first probe warms the prefix (not counted: the feed is
	// not fresh before its first event).
	eventually(t, "four measured probes", func() bool { _, n := k.canary.Accuracy(); return n >= 4 })
	acc, n := k.canary.Accuracy()
	if acc != 1 || k.canary.MeanAbsError() != 0 {
		t.Errorf("canary accuracy %v over %d probes, mean abs error %v", acc, n, k.canary.MeanAbsError())
	}
	if k.canary.Errors() != 0 || k.canary.Unsupported() != 0 {
		t.Errorf("canary errors %d unsupported %d", k.canary.Errors(), k.canary.Unsupported())
	}
	if probs, err := testutil.CollectAndLint(kvCollector{}); err != nil || len(probs) > 0 {
		t.Errorf("lint: %v %v", err, probs)
	}
	if n := testutil.CollectAndCount(kvCollector{}, "ramjet_kv_canary_accuracy"); n != 1 {
		t.Errorf("%d ramjet_kv_canary_accuracy series", n)
	}
}

func TestE2EKVSurvivesReload(t *testing.T) {
	sim, events, replay := startKVSim(t)
	addr := sim.Addr()
	opts := proxyOpts{Policy: map[string]any{"kv": map[string]any{
		"engines": []any{map[string]any{"upstream": addr, "events": events, "replay": replay, "ranks": 2}},
		"topic":   "kv-events",
	}}}
	c := startCaddy(t, []string{addr, addr}, opts)
	cl := newClient(c)
	k := liveKV(t)
	for i := range 4 {
		kvChat(t, cl, sim.Model(), []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("reload %d", i), 400))})
	}
	eventually(t, "entries", func() bool { return k.x.Entries() > 0 })
	entries := k.x.Entries()

	// A reload that keeps the kv settings keeps the index and its feeds.
	opts.Tag = "second"
	c.reload(opts)
	if liveKV(t) != k {
		t.Fatal("the kv state was rebuilt by a reload with the same kv settings")
	}
	if k.x.Entries() < entries || k.x.Fences(kvindex.FenceReconnect) != 0 {
		t.Errorf("entries %d (had %d), reconnect fences %d", k.x.Entries(), entries, k.x.Fences(kvindex.FenceReconnect))
	}
	kvChat(t, cl, sim.Model(), []openai.ChatCompletionMessageParamUnion{userMsg(longText("after reload", 400))})

	// Changing them starts a new index; the old feeds are closed.
	opts.Policy["kv"].(map[string]any)["block_size"] = 32
	c.reload(opts)
	if k2 := liveKV(t); k2 == k {
		t.Fatal("the kv state was kept across a change of block_size")
	}
	eventually(t, "the old feeds closed", func() bool {
		for _, st := range k.x.AppendReplicaStats(nil) {
			if st.Connected {
				return false
			}
		}
		return true
	})
}
