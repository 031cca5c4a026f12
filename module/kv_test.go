package module

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/envcheck"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

func TestKVCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    *kvindex.Settings
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
			want: &kvindex.Settings{
				Engines: []kvindex.FeedSpec{
					{Upstream: "127.0.0.1:8005", Events: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558", Ranks: 2},
					{Upstream: "127.0.0.1:8006", Events: "tcp://127.0.0.1:5567"},
				},
				Topic: "kv-events", BlockSize: 32, MaxEntries: 5000,
				PredictTTL: duration.Duration(3 * time.Second), TokenizeTimeout: duration.Duration(200 * time.Millisecond),
				TokenizeConcurrency: 8, TokenizeCache: 100, TokenizeURL: "http://127.0.0.1:8005",
				Canary: &kvindex.CanarySettings{Model: "qwen3-32b", Interval: duration.Duration(10 * time.Second), Blocks: 2},
			},
		},
		{name: "no kv", give: `ramjet {
				alpha 2
			}`},
		{name: "tokenize alone", give: "ramjet {\n tokenize\n}", want: &kvindex.Settings{}},
		{name: "kv_events args", give: "ramjet {\n kv_events 127.0.0.1:8005\n}", wantErr: "want <upstream> [dial|bind] <events>"},
		{
			name: "bind and dial",
			give: `ramjet {
				kv_events 127.0.0.1:8005 bind tcp://127.0.0.1:5557 tcp://127.0.0.1:5558 {
					topic kv@127.0.0.1:8005@m
				}
				kv_events 127.0.0.1:8006 bind tcp://127.0.0.1:5557 {
					topic kv@127.0.0.1:8006@m
				}
				kv_events 127.0.0.1:8007 dial tcp://127.0.0.1:5567
			}`,
			want: &kvindex.Settings{Engines: []kvindex.FeedSpec{
				{Upstream: "127.0.0.1:8005", Events: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558", Bind: true, Topic: "kv@127.0.0.1:8005@m"},
				{Upstream: "127.0.0.1:8006", Events: "tcp://127.0.0.1:5557", Bind: true, Topic: "kv@127.0.0.1:8006@m"},
				{Upstream: "127.0.0.1:8007", Events: "tcp://127.0.0.1:5567"},
			}},
		},
		{name: "engine topic twice", give: "ramjet {\n kv_events a:1 bind tcp://a:2 {\n topic x\n topic y\n }\n}", wantErr: "topic specified more than once"},
		{name: "kv_events twice", give: "ramjet {\n kv_events a:1 tcp://a:2\n kv_events a:1 tcp://a:3\n}",
			wantErr: "upstream a:1 listed twice"},
		{name: "ranks zero", give: "ramjet {\n kv_events a:1 tcp://a:2 {\n ranks 0\n }\n}", wantErr: `kv_events ranks: "0" is not a positive integer`},
		{name: "ranks unknown", give: "ramjet {\n kv_events a:1 tcp://a:2 {\n rank 2\n }\n}", wantErr: "unrecognized option 'rank'"},
		{name: "topic twice", give: "ramjet {\n kv_topic a\n kv_topic b\n}", wantErr: "specified more than once"},
		{name: "bad ttl", give: "ramjet {\n kv_predict_ttl soon\n}", wantErr: `kv_predict_ttl: "soon" is not a positive duration`},
		{name: "queue rule off", give: "ramjet {\n kv_queue_estimate off\n}", want: &kvindex.Settings{QueueEstimate: -1}},
		{name: "queue rule at half a cache", give: "ramjet {\n kv_queue_estimate 0.5\n}", want: &kvindex.Settings{QueueEstimate: 0.5}},
		{name: "bad queue rule", give: "ramjet {\n kv_queue_estimate soon\n}", wantErr: "kv_queue_estimate"},
		{name: "cap load off", give: "ramjet {\n kv_cap_load off\n}", want: &kvindex.Settings{CapLoad: -1}},
		{name: "cap load at two caches", give: "ramjet {\n kv_cap_load 2\n}", want: &kvindex.Settings{CapLoad: 2}},
		{name: "bad cap load", give: "ramjet {\n kv_cap_load soon\n}", wantErr: "kv_cap_load"},
		{name: "foreign queue cap off", give: "ramjet {\n kv_cap_foreign_queue off\n}", want: &kvindex.Settings{CapForeignQueue: -1}},
		{name: "foreign queue cap at two caches", give: "ramjet {\n kv_cap_foreign_queue 2\n}", want: &kvindex.Settings{CapForeignQueue: 2}},
		{name: "bad foreign queue cap", give: "ramjet {\n kv_cap_foreign_queue soon\n}", wantErr: "kv_cap_foreign_queue"},
		{name: "tokenize unknown", give: "ramjet {\n tokenize {\n retries 3\n }\n}", wantErr: "unrecognized option 'retries'"},
		{name: "canary unknown", give: "ramjet {\n kv_canary m {\n every 1s\n }\n}", wantErr: "unrecognized option 'every'"},
		{name: "unknown kv option", give: "ramjet {\n kv_everything 1\n}", wantErr: "ramjet: unrecognized option 'kv_everything'"},
		{
			name: "https engine with upstream token",
			give: "ramjet {\n kv_events 127.0.0.1:8443 tcp://127.0.0.1:5557 {\n scheme https\n }\n kv_upstream_token {env.RJ_UPSTREAM_TOKEN}\n}",
			want: &kvindex.Settings{
				Engines:       []kvindex.FeedSpec{{Upstream: "127.0.0.1:8443", Events: "tcp://127.0.0.1:5557", Scheme: "https"}},
				UpstreamToken: "{env.RJ_UPSTREAM_TOKEN}",
			},
		},
		{name: "bad scheme", give: "ramjet {\n kv_events a:1 tcp://a:2 {\n scheme ftp\n }\n}", wantErr: "must be http or https"},
		{name: "scheme twice", give: "ramjet {\n kv_events a:1 tcp://a:2 {\n scheme http\n scheme https\n }\n}", wantErr: "scheme specified more than once"},
		{name: "token twice", give: "ramjet {\n kv_upstream_token a\n kv_upstream_token b\n}", wantErr: "specified more than once"},
		{
			name: "template",
			give: `ramjet {
				kv_events 127.0.0.1:21005 tcp://127.0.0.1:21557
				kv_events * tcp://{upstream.host}:{upstream.port+1} tcp://{upstream.host}:5558 {
					scheme https
					resolvers 127.0.0.1:21053 127.0.0.1
				}
			}`,
			want: &kvindex.Settings{Engines: []kvindex.FeedSpec{
				{Upstream: "127.0.0.1:21005", Events: "tcp://127.0.0.1:21557"},
				{Upstream: "*", Events: "tcp://{upstream.host}:{upstream.port+1}", Replay: "tcp://{upstream.host}:5558",
					Scheme: "https", Resolvers: []string{"127.0.0.1:21053", "127.0.0.1"}},
			}},
		},
		{name: "template twice", give: "ramjet {\n kv_events * tcp://{upstream.host}:5557\n kv_events * tcp://{upstream.host}:5558\n}",
			wantErr: "kv_events *: engines[1]: upstream * listed twice"},
		{name: "template bind", give: "ramjet {\n kv_events * bind tcp://{upstream.host}:5557\n}", wantErr: "bind is not supported"},
		// The Caddyfile adapter turns {host} into {http.request.host}.
		{name: "template request host", give: "ramjet {\n kv_events * tcp://{http.request.host}:5557\n}", wantErr: "write {upstream.host}"},
		{name: "template unknown placeholder", give: "ramjet {\n kv_events * tcp://{upstream.name}:5557\n}", wantErr: "unknown placeholder {upstream.name}"},
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
func startKVSim(t *testing.T, opts ...func(*enginesim.Options)) (*enginesim.Server, string, string) {
	t.Helper()
	// ZMQ binds the ports it is given: another process may take one after
	// consecutivePorts, so a start failing with EADDRINUSE is retried.
	var sim *enginesim.Server
	var events, replay string
	for attempt := 0; sim == nil; attempt++ {
		ev, rp := consecutivePorts(t), consecutivePorts(t)
		events, replay = fmt.Sprintf("tcp://127.0.0.1:%d", ev), fmt.Sprintf("tcp://127.0.0.1:%d", rp)
		o := enginesim.Options{
			Instant: true, DP: 2,
			Engine:   engine.Config{BlockSize: 16, CapacityTokens: 4096 * 16},
			KVEvents: enginesim.KVEventsOptions{Endpoint: events, ReplayEndpoint: replay, Topic: "kv-events"},
		}
		for _, f := range opts {
			f(&o)
		}
		var err error
		sim, err = enginesim.Start(context.Background(), o)
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
	k, _ := kvLive.Get(DefaultStateKey)
	if k == nil {
		t.Fatal("no live kv state")
	}
	return k
}

// warmKV sends warm-up requests through cl until both ranks of the
// engine at addr delivered an event (until then the replicas are routed by
// the estimate).
func warmKV(t *testing.T, cl openai.Client, model string, k *kvState, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		r0, _ := k.p.Index().Lookup(addr + "#0")
		r1, _ := k.p.Index().Lookup(addr + "#1")
		if k.p.Index().Fresh(r0) && k.p.Index().Fresh(r1) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("feeds never became fresh: %+v", k.p.Index().AppendReplicaStats(nil))
		}
		// Distinct prompts longer than a block, so that the rendezvous
		// tie-break spreads them over both ranks.
		kvChat(t, cl, model, []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("warm-up %d", i), 400))})
	}
}

// startPreciseCaddy is a Caddy in front of one two-rank simulated engine,
// both ranks (replicas addr#0 and addr#1) on the precise path.
func startPreciseCaddy(t *testing.T) (sim *enginesim.Server, addr string, cl openai.Client, k *kvState) {
	t.Helper()
	sim, events, replay := startKVSim(t)
	addr = sim.Addr()
	c := startCaddy(t, []string{addr, addr}, proxyOpts{Policy: map[string]any{"kv": map[string]any{
		"engines":          []any{map[string]any{"upstream": addr, "events": events, "replay": replay, "ranks": 2}},
		"topic":            "kv-events",
		"tokenize_timeout": "2s",
		"tokenize_wait":    "always", // the precise decisions under test (a lone instance, nothing evicted)
	}}})
	return sim, addr, newClient(c), liveKV(t)
}

func TestE2EKVPreciseRouting(t *testing.T) {
	sim, addr, cl, k := startPreciseCaddy(t)
	model := sim.Model()

	warmKV(t, cl, model, k, addr)
	before := k.preciseN()

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
	if got := k.preciseN() - before; got != 18 {
		t.Errorf("%d of 18 decisions were precise", got)
	}
	if hits != turnsAfterFirst {
		t.Errorf("%d of %d later turns found cached tokens", hits, turnsAfterFirst)
	}
	// Later requests were routed on a cached message prefix at once; each
	// sent its own preflight once its response began (or it ended), and
	// every one of them was compared with the prefix it had.
	routed, _, disagreed := k.p.PrefixStats()
	if routed == 0 || disagreed != 0 {
		t.Errorf("routed on a cached prefix %d, prefix checks disagreed %d; want some, 0", routed, disagreed)
	}
	eventually(t, "every deferred preflight compared", func() bool { _, agreed, _ := k.p.PrefixStats(); return agreed >= routed })
	t.Logf("precise decisions %d, later turns with cached tokens %d/%d, index entries %d, tokenize cache hits %d",
		k.preciseN()-before, hits, turnsAfterFirst, k.p.Index().Entries(), k.p.Tokenizer().CacheHits())
	if n := k.p.Tokenizer().Fallbacks(kvindex.FallbackTimeout) + k.p.Tokenizer().Fallbacks(kvindex.FallbackError); n != 0 {
		t.Errorf("%d tokenize fallbacks", n)
	}

	// The metrics: stable names, lint-clean.
	if probs, err := testutil.CollectAndLint(kvCollector()); err != nil || len(probs) > 0 {
		t.Errorf("lint: %v %v", err, probs)
	}
	const want = `
# HELP ramjet_kv_feed_fresh 1 when the replica's KV event feed is trusted and its exact overlap is used.
# TYPE ramjet_kv_feed_fresh gauge
`
	if n := testutil.CollectAndCount(kvCollector(), "ramjet_kv_feed_fresh"); n != 2 {
		t.Errorf("%d ramjet_kv_feed_fresh series, want 2 (one per rank)%s", n, want)
	}
	// Every kvindex counter kvindex/README.md lists is exported.
	for _, name := range []string{"ramjet_kv_index_orphans_total", "ramjet_kv_index_unknown_removals_total",
		"ramjet_kv_index_removed_total", "ramjet_kv_index_skipped_total",
		"ramjet_kv_index_block_size_mismatches_total", "ramjet_kv_index_non_chain_blocks_total",
		"ramjet_kv_replay_failures_total"} {
		if n := testutil.CollectAndCount(kvCollector(), name); n != 1 {
			t.Errorf("%d %s series, want 1", n, name)
		}
	}
	if n := testutil.CollectAndCount(kvCollector(), "ramjet_kv_feed_healthy"); n != 2 {
		t.Errorf("%d ramjet_kv_feed_healthy series, want 2 (one per rank)", n)
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
	if k.preciseN() != 0 || k.approxN() != 4 {
		t.Errorf("precise %d approximate %d, want 0 and 4", k.preciseN(), k.approxN())
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
	eventually(t, "four measured probes", func() bool { _, n := k.p.Canary().Accuracy(); return n >= 4 })
	acc, n := k.p.Canary().Accuracy()
	if acc != 1 || k.p.Canary().MeanAbsError() != 0 {
		t.Errorf("canary accuracy %v over %d probes, mean abs error %v", acc, n, k.p.Canary().MeanAbsError())
	}
	if k.p.Canary().Errors() != 0 || k.p.Canary().Unsupported() != 0 {
		t.Errorf("canary errors %d unsupported %d", k.p.Canary().Errors(), k.p.Canary().Unsupported())
	}
	if probs, err := testutil.CollectAndLint(kvCollector()); err != nil || len(probs) > 0 {
		t.Errorf("lint: %v %v", err, probs)
	}
	if n := testutil.CollectAndCount(kvCollector(), "ramjet_kv_canary_accuracy"); n != 1 {
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
	// ZMQ drops what a PUB sends before the SUB's subscription reached it:
	// wait for the feeds, then chat until the engine's stores land.
	eventually(t, "the feeds connected", func() bool {
		stats := k.p.Index().AppendReplicaStats(nil)
		for _, st := range stats {
			if !st.Connected {
				return false
			}
		}
		return len(stats) > 0
	})
	i := 0
	eventually(t, "entries", func() bool {
		kvChat(t, cl, sim.Model(), []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("reload %d", i), 400))})
		i++
		return i >= 4 && k.p.Index().Entries() > 0
	})
	entries := k.p.Index().Entries()

	// A reload that keeps the kv settings keeps the index and its feeds.
	opts.Tag = "second"
	c.reload(opts)
	if liveKV(t) != k {
		t.Fatal("the kv state was rebuilt by a reload with the same kv settings")
	}
	if k.p.Index().Entries() < entries || k.p.Index().Fences(kvindex.FenceReconnect) != 0 {
		t.Errorf("entries %d (had %d), reconnect fences %d", k.p.Index().Entries(), entries, k.p.Index().Fences(kvindex.FenceReconnect))
	}
	kvChat(t, cl, sim.Model(), []openai.ChatCompletionMessageParamUnion{userMsg(longText("after reload", 400))})

	// Changing them starts a new index; the old feeds are closed.
	opts.Policy["kv"].(map[string]any)["block_size"] = 32
	c.reload(opts)
	if k2 := liveKV(t); k2 == k {
		t.Fatal("the kv state was kept across a change of block_size")
	}
	eventually(t, "the old feeds closed", func() bool {
		for _, st := range k.p.Index().AppendReplicaStats(nil) {
			if st.Connected {
				return false
			}
		}
		return true
	})
}

func (k *kvState) preciseN() uint64 { n, _ := k.p.Decisions(); return n }
func (k *kvState) approxN() uint64  { _, n := k.p.Decisions(); return n }

// TestModuleAndFleetsimDecideAlikePrecise is the precise-path version of
// TestModuleAndFleetsimDecideAlike: the module routes through the real
// Caddy with kv on (preflight in the handler, feeds from the engine
// simulator's two data-parallel ranks over ZMQ); the simulation's ramjet
// policy routes with its own kvindex.Precise subscribed to the same PUB
// sockets, token ids from the same /tokenize. Before every request both
// indexes are waited on until they hold the same state (same events
// applied, same freshness, same predictions, no load), so that the event
// timing is the same on both sides; then the simulation decides, the
// module serves the request, and the replicas must agree. foreign_prefill
// (on by default with kv alone, and the spill band with it) is off: the
// simulation's side here is one precise ramjet policy without them (the
// fleet simulation's "fp" variant drives them, bench/fleetsim/precise.go).
func TestModuleAndFleetsimDecideAlikePrecise(t *testing.T) {
	sim, events, replay := startKVSim(t)
	addr := sim.Addr()
	c := startCaddy(t, []string{addr, addr}, proxyOpts{Policy: map[string]any{"foreign_prefill": "off", "kv": map[string]any{
		"engines":          []any{map[string]any{"upstream": addr, "events": events, "replay": replay, "ranks": 2}},
		"topic":            "kv-events",
		"tokenize_timeout": "5s",
		"tokenize_wait":    "always", // fleetsim's ramjet-precise@always
	}}})
	k := liveKV(t)
	f := lookupFleet("")
	keys := []string{addr + "#0", addr + "#1"}

	var engines []kvindex.PreciseEngine
	for rank := range 2 {
		ep, err := kvindex.RankEndpoint(addr, events, replay, "kv-events", rank)
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, kvindex.PreciseEngine{Feed: ep})
	}
	pre, err := kvindex.NewPrecise(kvindex.PreciseConfig{Index: kvindex.Config{BlockSize: 16, MaxEntries: 1 << 20}, Engines: engines})
	if err != nil {
		t.Fatal(err)
	}
	pre.Start(context.Background())
	defer pre.Close()
	pol, err := fleetsim.NewRamjet(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pol.UseReplicaKeys(keys)
	pol.UsePrecise(pre)
	replicas := []*fleetsim.Replica{{ID: 0}, {ID: 1}}
	tk := kvindex.NewTokenizer(kvindex.TokenizerConfig{Timeout: 5 * time.Second})
	feat := pol.Router().Extractor().NewFeatures()

	stats := func(x *kvindex.Index) map[string]kvindex.ReplicaStats {
		m := map[string]kvindex.ReplicaStats{}
		for _, st := range x.AppendReplicaStats(nil) {
			m[st.ID] = st
		}
		return m
	}
	synced := func() bool {
		if totalInflight(f) != 0 || totalPending(f) != 0 {
			return false
		}
		a, b := stats(k.p.Index()), stats(pre.Index())
		for _, key := range keys {
			if a[key].Fresh != b[key].Fresh || a[key].Applied != b[key].Applied || a[key].Entries != b[key].Entries {
				return false
			}
		}
		return k.p.Index().Predicted() == pre.Index().Predicted()
	}
	allFresh := func() bool {
		a, b := stats(k.p.Index()), stats(pre.Index())
		return a[keys[0]].Fresh && a[keys[1]].Fresh && b[keys[0]].Fresh && b[keys[1]].Fresh
	}
	keyOf := func(id string) string {
		for _, r := range f.replicas() {
			if r.ID == id {
				return r.Key
			}
		}
		return ""
	}
	send := func(body string) string {
		t.Helper()
		resp, _ := c.post("/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return keyOf(resp.Header.Get(HeaderUpstream))
	}
	parse := func(body string) {
		t.Helper()
		if err := pol.Router().Extractor().Parse(selection.EndpointChat, []byte(body), feat); err != nil {
			t.Fatal(err)
		}
	}

	var warmScratch selection.Scratch
	// Warm-up until both indexes follow both feeds: the module decides,
	// and the simulation's approximate index learns the same choices.
	for i := 0; !(allFresh() && poll(2*time.Second, synced)); i++ {
		if i == 40 {
			t.Fatalf("indexes never in step: module %+v, simulation %+v", k.p.Index().AppendReplicaStats(nil), pre.Index().AppendReplicaStats(nil))
		}
		body := chatBody(sim.Model(), false, [2]string{"user", longText(fmt.Sprintf("warm-up %d", i), 400)})
		got := send(body)
		parse(body)
		slot, ok := pol.Router().Lookup(got)
		if !ok {
			// Not registered yet: the simulation registers replicas in
			// order on its first decision.
			rq := &fleetsim.Request{Row: workload.Request{ID: -1 - i}}
			pol.PickFeatures(feat, rq, replicas)
			pol.Done(rq, 0)
			slot, _ = pol.Router().Lookup(got)
		}
		// The simulation's router replays the module's decision whole
		// (learn, reserve, first token, release), so that what a released
		// request leaves on its replica (the pair term's lingering context)
		// is on the same replica in both.
		_, res := pol.Router().Route(feat, []selection.Candidate{{Slot: slot, Usable: true}}, &warmScratch, nil, nil)
		res.PrefillDone()
		res.Release()
		poll(2*time.Second, func() bool { return totalInflight(f) == 0 })
	}

	// Conversations over two shared system prompts, compared decision by
	// decision.
	preciseBefore := k.preciseN()
	systems := []string{longText("billing", 3000), longText("shipping", 3000)}
	convs := make([][][2]string, 4)
	n, agree := 0, 0
	for turn := range 3 {
		for ci := range convs {
			if turn == 0 {
				convs[ci] = [][2]string{{"system", systems[ci%2]}}
			}
			convs[ci] = append(convs[ci], [2]string{"user", longText(fmt.Sprintf("conv %d turn %d", ci, turn), 300)})
			body := chatBody(sim.Model(), false, convs[ci]...)
			convs[ci] = append(convs[ci], [2]string{"assistant", "noted"})
			if !poll(10*time.Second, synced) {
				t.Fatalf("request %d: indexes out of step: module %+v predicted %d, simulation %+v predicted %d", n,
					k.p.Index().AppendReplicaStats(nil), k.p.Index().Predicted(), pre.Index().AppendReplicaStats(nil), pre.Index().Predicted())
			}
			parse(body)
			req, err := kvindex.RequestFor(selection.EndpointChat, []byte(body), feat)
			if err != nil {
				t.Fatal(err)
			}
			toks, err := tk.Tokenize(context.Background(), "http://"+addr, uint64(n), req)
			if err != nil {
				t.Fatal(err)
			}
			rq := &fleetsim.Request{Row: workload.Request{ID: n}, Prompt: toks}
			rep := pol.PickFeatures(feat, rq, replicas)
			pol.FirstToken(rq, rep)
			pol.Done(rq, rep)

			got := send(body)
			if got == keys[rep] {
				agree++
			} else {
				t.Errorf("request %d: the module chose %q, the simulation %q", n, got, keys[rep])
			}
			n++
		}
	}
	simPrecise, _ := pre.Decisions()
	if got := k.preciseN() - preciseBefore; got != uint64(n) || simPrecise < uint64(n) {
		t.Errorf("precise decisions: module %d, simulation %d, of %d", got, simPrecise, n)
	}
	t.Logf("%d of %d decisions agree; reasons in the simulation %v", agree, n, pol.Reasons)
}

// TestE2EKVNoPreflightInSelect checks that Select itself never sends the
// /tokenize preflight: without the ramjet handler in the chain, even with
// every feed fresh, no preflight is sent and every decision uses the
// estimate.
func TestE2EKVNoPreflightInSelect(t *testing.T) {
	sim, events, replay := startKVSim(t)
	addr := sim.Addr()
	c := startCaddy(t, []string{addr, addr}, proxyOpts{NoHandler: true, Policy: map[string]any{"kv": map[string]any{
		"engines": []any{map[string]any{"upstream": addr, "events": events, "replay": replay, "ranks": 2}},
		"topic":   "kv-events",
	}}})
	cl := newClient(c)
	k := liveKV(t)
	fresh := func() bool {
		r0, _ := k.p.Index().Lookup(addr + "#0")
		r1, _ := k.p.Index().Lookup(addr + "#1")
		return k.p.Index().Fresh(r0) && k.p.Index().Fresh(r1)
	}
	n := 0
	for ; !fresh(); n++ {
		if n == 40 {
			t.Fatalf("feeds never became fresh: %+v", k.p.Index().AppendReplicaStats(nil))
		}
		kvChat(t, cl, sim.Model(), []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("no handler %d", n), 400))})
	}
	for i := range 4 {
		kvChat(t, cl, sim.Model(), []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("fresh %d", i), 400))})
		n++
	}
	if sent := k.p.Tokenizer().CacheMisses() + k.p.Tokenizer().CacheHits(); sent != 0 {
		t.Errorf("%d preflight lookups without the handler, want 0", sent)
	}
	if k.preciseN() != 0 || k.approxN() != uint64(n) {
		t.Errorf("precise %d approximate %d, want 0 and %d", k.preciseN(), k.approxN(), n)
	}
}

// TestKVPreciseConfig checks what the module hands kvindex.Precise: one
// engine per rank keyed like the policy's replicas, each engine's scheme,
// the rank header, and the resolved upstream token.
func TestKVPreciseConfig(t *testing.T) {
	t.Setenv("RJ_TEST_UPSTREAM_TOKEN", "tok")
	c := &kvindex.Settings{UpstreamToken: "{env.RJ_TEST_UPSTREAM_TOKEN}", Engines: []kvindex.FeedSpec{
		{Upstream: "127.0.0.1:8443", Events: "tcp://127.0.0.1:5557", Ranks: 2, Scheme: "https"},
		{Upstream: "127.0.0.1:8000", Events: "tcp://127.0.0.1:6557"},
	}}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	pc, err := c.Precise(resolveSecret(c.UpstreamToken), HeaderRank, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	type eng struct{ Replica, Events, BaseURL, Rank string }
	var got []eng
	for _, e := range pc.Engines {
		rank := ""
		//lint:ignore SA1008 the rank header is kept as written, like on the proxied requests
		if v := e.Header[HeaderRank]; len(v) == 1 {
			rank = v[0]
		}
		got = append(got, eng{e.Feed.Replica, e.Feed.Events, e.BaseURL, rank})
	}
	want := []eng{
		{"127.0.0.1:8443#0", "tcp://127.0.0.1:5557", "https://127.0.0.1:8443", "0"},
		{"127.0.0.1:8443#1", "tcp://127.0.0.1:5558", "https://127.0.0.1:8443", "1"},
		{"127.0.0.1:8000", "tcp://127.0.0.1:6557", "http://127.0.0.1:8000", ""},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("engines (-want +got):\n%s", diff)
	}
	if pc.Token != "tok" {
		t.Errorf("token %q, want the resolved placeholder", pc.Token)
	}
}

// The production Caddyfile turns the precise path on from RJ_KV_* alone,
// in both socket directions.
func TestDeployCaddyfileKV(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, envcheck.EnvPrefix) {
			t.Setenv(name, "")
		}
	}
	src, err := os.ReadFile("../deploy/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	adapt := func(env map[string]string) (*kvindex.Settings, error) {
		for k, v := range env {
			t.Setenv(k, v)
		}
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "deploy/Caddyfile"})
		if err != nil {
			return nil, err
		}
		i := bytes.Index(out, []byte(`"kv":`))
		if i < 0 {
			return nil, nil
		}
		var kv kvindex.Settings
		dec := json.NewDecoder(bytes.NewReader(out[i+len(`"kv":`):]))
		return &kv, dec.Decode(&kv)
	}
	kv, err := adapt(map[string]string{"RJ_UPSTREAM": "127.0.0.1:8100,127.0.0.1:8200",
		"RJ_KV_EVENTS":        "127.0.0.1:8100=tcp://127.0.0.1:5557,127.0.0.1:8200=tcp://127.0.0.1:5567",
		"RJ_KV_REPLAY":        "127.0.0.1:8100=tcp://127.0.0.1:5558",
		"RJ_TOKENIZE_TIMEOUT": "250ms", "RJ_TOKENIZE_WAIT": "always", "RJ_KV_QUEUE_ESTIMATE": "off",
		"RJ_KV_CAP_LOAD": "2.5", "RJ_KV_CAP_FOREIGN_QUEUE": "off"})
	if err != nil {
		t.Fatal(err)
	}
	want := &kvindex.Settings{Engines: []kvindex.FeedSpec{
		{Upstream: "127.0.0.1:8100", Events: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558"},
		{Upstream: "127.0.0.1:8200", Events: "tcp://127.0.0.1:5567"},
	}, TokenizeTimeout: duration.Duration(250 * time.Millisecond), TokenizeWait: "always", QueueEstimate: -1, CapLoad: 2.5, CapForeignQueue: -1}
	if diff := cmp.Diff(want, kv); diff != "" {
		t.Errorf("dial (-want +got):\n%s", diff)
	}
	t.Setenv("RJ_KV_EVENTS", "")
	t.Setenv("RJ_KV_REPLAY", "")
	t.Setenv("RJ_TOKENIZE_WAIT", "")
	t.Setenv("RJ_KV_QUEUE_ESTIMATE", "")
	t.Setenv("RJ_KV_CAP_LOAD", "")
	t.Setenv("RJ_KV_CAP_FOREIGN_QUEUE", "")
	kv, err = adapt(map[string]string{"RJ_KV_BIND": "tcp://127.0.0.1:5557",
		"RJ_KV_TOPICS": "127.0.0.1:8100=kv@a 127.0.0.1:8200=kv@b"})
	if err != nil {
		t.Fatal(err)
	}
	if kv == nil || len(kv.Engines) != 2 || !kv.Engines[0].Bind || kv.Engines[1].Topic != "kv@b" {
		t.Errorf("bind: %+v", kv)
	}
	t.Setenv("RJ_KV_BIND", "")
	t.Setenv("RJ_KV_TOPICS", "")
	// A kv setting without a feed is refused, not ignored.
	if _, err := adapt(nil); err == nil || !strings.Contains(err.Error(), "need kv_events or kv_bind") {
		t.Errorf("RJ_TOKENIZE_TIMEOUT alone: %v", err)
	}
	t.Setenv("RJ_TOKENIZE_TIMEOUT", "")
	if kv, err := adapt(nil); err != nil || kv != nil {
		t.Errorf("no RJ_KV_*: kv %+v, err %v", kv, err)
	}
}

// TestE2EKVColdStartPredicts: a request routed before any feed is fresh
// (the cold start: the feeds connected, no store yet) is routed by the
// estimate without waiting, but its preflight still runs in the background
// and its tokens predict the blocks of the replica it went to
// (kvindex.Precise.ColdPreflight), so that the replica's feed, turning
// fresh with the request's first stores, shows the whole prompt on its way.
func TestE2EKVColdStartPredicts(t *testing.T) {
	sim, addr, cl, k := startPreciseCaddy(t)
	r0, _ := k.p.Index().Lookup(addr + "#0")
	r1, _ := k.p.Index().Lookup(addr + "#1")
	eventually(t, "the feeds connected", func() bool { return k.p.Index().Stats(r0).Connected && k.p.Index().Stats(r1).Connected })
	if k.p.Ready() || !k.p.Cold() {
		t.Fatalf("ready %v cold %v before any store, want the cold start", k.p.Ready(), k.p.Cold())
	}
	if err := sim.SetFaults(enginesim.Faults{Latency: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	kvChat(t, cl, sim.Model(), []openai.ChatCompletionMessageParamUnion{userMsg(longText("cold start", 600))})
	if n := k.preciseN(); n != 0 {
		t.Errorf("%d precise decisions in the cold start, want 0", n)
	}
	// The request ends with the tokens predicted (the engine takes 2 s to
	// start it; the /tokenize call is not delayed).
	if got := k.p.LateOutcomes(kvindex.LatePredicted); got != 1 {
		t.Errorf("cold preflights predicted %d, want 1 (after the end %d, failed %d, unrouted %d)", got,
			k.p.LateOutcomes(kvindex.LateAfterEnd), k.p.LateOutcomes(kvindex.LateFailed), k.p.LateOutcomes(kvindex.LateUnrouted))
	}
}
