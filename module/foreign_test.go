package module

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestForeignPrefillWired runs foreign_prefill through the configuration
// path (Caddyfile -> JSON -> Provision): on by default with kv (with or
// without engine_metrics), off otherwise, off with "off"; "on" without kv
// and a word other than on|off|queues are errors. The others' unseen load
// (SetPrior) is counted by default and with queues, not with on; with
// engine_metrics too (it then applies only to replicas without a fresh
// scrape: selection.Router.ExternalFresh).
func TestForeignPrefillWired(t *testing.T) {
	// Nothing listens on these: the feeds and the scrapes only retry.
	const kv = "kv_events 127.0.0.1:9 tcp://127.0.0.1:9\n"
	const em = "engine_metrics 1h\n"
	tests := []struct {
		name, block string
		want        bool
		prior       float64
	}{
		{"bare", "", false, 0},
		{"kv only", kv, true, selection.DefaultForeignPrior},
		{"kv only, on", kv + "foreign_prefill on\n", true, 0},
		{"kv only, queues", kv + "foreign_prefill queues\n", true, 1},
		{"kv only, off", kv + "foreign_prefill off\n", false, 0},
		{"kv and engine_metrics", kv + em, true, selection.DefaultForeignPrior},
		{"kv and engine_metrics, off", kv + em + "foreign_prefill off\n", false, 0},
		{"kv and engine_metrics, on", kv + em + "foreign_prefill on\n", true, 0},
		{"kv and engine_metrics, queues", kv + em + "foreign_prefill queues\n", true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "foreign_" + strings.NewReplacer(" ", "_", ",", "").Replace(tt.name)
			p, err := provisionKeep(t, "ramjet {\n state_key "+key+"\n "+tt.block+"}")
			if err != nil {
				t.Fatal(err)
			}
			defer p.Cleanup()
			if got := p.foreignFor() != nil; got != tt.want {
				t.Errorf("foreign prefill on: %v, want %v", got, tt.want)
			}
			if fp := p.foreignFor(); fp != nil && fp.Prior() != tt.prior {
				t.Errorf("the others' unseen load at %v, want %v", fp.Prior(), tt.prior)
			}
		})
	}
	if _, err := provisionSpillErr(t, "ramjet {\n foreign_prefill on\n}"); err == nil || !strings.Contains(err.Error(), "foreign_prefill") {
		t.Errorf("foreign_prefill on without kv: error %v, want one naming foreign_prefill", err)
	}
	var p RamjetSelection
	if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser("ramjet {\n foreign_prefill maybe\n}")); err == nil {
		t.Error("foreign_prefill maybe: no error")
	}
}

// TestForeignPrefillFeeds: a block run the engine's KV feed applies beyond
// this instance's own pending prefill reaches the policy's router as
// external prefill and the metric's totals; a reload that turns
// foreign_prefill off (same feeds, same state) takes it back to 0.
func TestForeignPrefillFeeds(t *testing.T) {
	const block = "ramjet {\n state_key foreign_feeds\n kv_events 127.0.0.1:9 tcp://127.0.0.1:9\n"
	p, err := provisionKeep(t, block+"}")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	fp := p.foreignFor()
	if fp == nil {
		t.Fatal("foreign_prefill is not on by default with kv alone")
	}
	s, err := p.rt.Register("127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	if !p.kv.p.Bind(s, "127.0.0.1:9") {
		t.Fatal("no feed for 127.0.0.1:9")
	}
	r, _ := p.kv.p.Index().Lookup("127.0.0.1:9")
	bs := p.kv.p.Index().BlockSize()
	toks := make([]uint32, 8*bs)
	for i := range toks {
		toks[i] = uint32(i)
	}
	p.kv.p.Index().Apply(r, &kvindex.Batch{Events: []kvindex.Event{{Kind: kvindex.KindBlockStored, Medium: "GPU",
		BlockHashes: []uint64{1, 2, 3, 4, 5, 6, 7, 8}, TokenIDs: toks, BlockSize: bs}}})
	if got := p.rt.ExternalPrefill(s); got != int64(8*bs) {
		t.Fatalf("external prefill %d after a foreign run of %d tokens", got, 8*bs)
	}
	if tok, runs := p.kv.fp.Counted(); tok != uint64(8*bs) || runs != 1 {
		t.Errorf("counted %d tokens in %d runs", tok, runs)
	}

	q, err := provisionKeep(t, block+" foreign_prefill off\n}")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Cleanup()
	if q.kv != p.kv {
		t.Fatal("the reload started new feeds")
	}
	if q.foreignFor() != nil || p.foreignFor() != nil {
		t.Error("foreign_prefill off after the reload, but an estimate is still fed")
	}
	if got := q.rt.ExternalPrefill(s); got != 0 {
		t.Errorf("external prefill %d after turning foreign_prefill off", got)
	}
}

// startForeignCaddy starts an engine simulator of two ranks publishing KV
// events (opts adjust it) and a real Caddy in front of it with kv and
// foreign_prefill unset (the default: on, and without engine_metrics the
// others' queues as a prior, as queues asks); it returns the engine, a
// client of the Caddy, the model and the live precise-path state. The
// preflight's timeout exceeds a loaded machine's stalls: a preflight that
// timed out credits a request with the bytes' estimate only, and its
// template's tokens read as foreign; so does a request the wait rule
// routes at once (tokenize_wait auto, the default, in a lone instance:
// the reservation counts the bytes' estimate until its late tokens come),
// hence always here.
func startForeignCaddy(t *testing.T, opts ...func(*enginesim.Options)) (*enginesim.Server, openai.Client, string, *kvState) {
	t.Helper()
	sim, events, replay := startKVSim(t, opts...)
	addr := sim.Addr()
	c := startCaddy(t, []string{addr, addr}, proxyOpts{Policy: map[string]any{"kv": map[string]any{
		"engines":          []any{map[string]any{"upstream": addr, "events": events, "replay": replay, "ranks": 2}},
		"topic":            "kv-events",
		"tokenize_timeout": "10s",
		"tokenize_wait":    "always",
	}}})
	return sim, newClient(c), sim.Model(), liveKV(t)
}

// TestE2EForeignPrefill: through a real Caddy and an engine simulator
// publishing KV events, this instance's own requests are credited (their
// stored runs are not another instance's prefill), while a prompt sent to
// the engine directly (another ramjet instance's request, as this one sees
// it) is counted as foreign prefill and reaches the router's load.
func TestE2EForeignPrefill(t *testing.T) {
	sim, cl, model, k := startForeignCaddy(t)
	addr := sim.Addr()
	if k.foreign.Load() == nil {
		t.Fatal("foreign_prefill on, but no estimate is fed")
	}
	warmKV(t, cl, model, k, addr)
	ownTok, _ := k.fp.Counted()
	const n = 6
	for i := range n {
		kvChat(t, cl, model, []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("own %d", i), 2000))})
	}
	afterOwn, _ := k.fp.Counted()
	t.Logf("own traffic: %d tokens counted as foreign during warm-up, %d during %d own requests of ~500 tokens", ownTok, afterOwn-ownTok, n)
	if afterOwn-ownTok > 2*n*16 {
		t.Errorf("this instance's own requests counted as %d foreign tokens", afterOwn-ownTok)
	}

	// Another instance's request: sent to rank 0 directly.
	direct := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1/"), option.WithAPIKey("test"),
		option.WithMaxRetries(0), option.WithRequestTimeout(30*time.Second),
		option.WithHeader(HeaderRank, "0"))
	kvChat(t, direct, model, []openai.ChatCompletionMessageParamUnion{userMsg(longText("another instance", 4000))})
	eventually(t, "the other instance's prefill counted", func() bool {
		tok, _ := k.fp.Counted()
		return tok >= afterOwn+4*16
	})
	tok, runs := k.fp.Counted()
	s, ok := k.fleet.Load().Router().Lookup(addr + "#0")
	if !ok {
		t.Fatal("rank 0 not registered")
	}
	if got := k.fleet.Load().Router().ExternalPrefill(s); got <= 0 {
		t.Errorf("rank 0's external prefill %d after another instance's %d tokens", got, tok-afterOwn)
	}
	for _, name := range []string{"ramjet_kv_foreign_prefill_tokens_total", "ramjet_kv_foreign_prefill_runs_total"} {
		if n := testutil.CollectAndCount(kvCollector(), name); n != 1 {
			t.Errorf("%d %s series, want 1", n, name)
		}
	}
	t.Logf("another instance's request: %d tokens in %d runs counted in all", tok, runs)

	// The others' unseen load: with foreign tokens counted, a request of
	// this instance reserves on its replica the others' share rho of its
	// prefill too (selection.ForeignPrefill.SetPrior, the default without
	// engine_metrics): once the stored-run estimate has decayed, that is
	// all the replica's external prefill, rho x at least a block of a
	// prompt no replica holds.
	rt, fp := k.fleet.Load().Router(), k.fp
	if fp.Prior() != 1 || fp.Share() <= 0 {
		t.Fatalf("prior %v, share %v after another instance's request", fp.Prior(), fp.Share())
	}
	if got, want := foreignShareGauge(t), fp.Share(); got != want {
		t.Errorf("ramjet_kv_foreign_share of this fleet %v, want rho %v", got, want)
	}
	var slots [2]selection.Slot
	for i := range slots {
		slots[i], _ = rt.Lookup(fmt.Sprintf("%s#%d", addr, i))
	}
	eventually(t, "the stored-run estimate decayed", func() bool {
		a, _ := fp.Estimate(slots[0], time.Now())
		b, _ := fp.Estimate(slots[1], time.Now())
		return a == 0 && b == 0
	})
	i := 0
	eventually(t, "an own request whose runs all read as its own", func() bool {
		i++
		before, _ := fp.Counted()
		id, _ := kvChat(t, cl, model, []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("own again %d", i), 2000))})
		s := slots[0]
		if id == fleetIDOf(addr+"#1") {
			s = slots[1]
		}
		got := rt.ExternalPrefill(s)
		if after, _ := fp.Counted(); after != before {
			return false // a run of it read as foreign rewrote the slot: another
		}
		if floor := fp.Share() * float64(k.p.Index().BlockSize()); got <= 0 || float64(got) < floor {
			t.Errorf("external prefill %d on the own request's replica, want at least rho (%.3f) x a block", got, fp.Share())
		}
		t.Logf("own request %d: external prefill %d, rho %.3f", i, got, fp.Share())
		return true
	})
}

// TestE2EForeignPrefillDecay: through a real Caddy and an engine simulator
// running 4 times faster than real time (the HTTP benchmark's time scale), the estimate's decay learns the
// engines' prefill speed from this instance's own first tokens: from the
// 1 s default (sized for the simulator's H200 at real time) to a fraction
// of it, so another instance's prefill fades as fast as these engines
// compute it.
func TestE2EForeignPrefillDecay(t *testing.T) {
	const scale = 4
	sim, cl, model, k := startForeignCaddy(t, func(o *enginesim.Options) { o.Instant, o.TimeScale = false, scale })
	addr := sim.Addr()
	if got := k.fp.Decay(); got != selection.DefaultForeignTau {
		t.Fatalf("decay %v before any first token, want the default %v", got, selection.DefaultForeignTau)
	}
	warmKV(t, cl, model, k, addr)
	// Distinct prompts of about 2000 tokens: each a prefill worth timing.
	const n = 30
	var shortest, longest time.Duration
	for i := range n {
		start := time.Now()
		kvChat(t, cl, model, []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("own %d", i), 8000))})
		took := time.Since(start)
		if i == 0 || took < shortest {
			shortest = took
		}
		longest = max(longest, took)
	}
	// Each response's end taught it a request's life: the others'
	// contexts decay with ResidentLives times the mean, which lies below the
	// longest request as the client timed them (the proxy's own view is a
	// little shorter) and above half the shortest (the weighted mean keeps
	// about 40% of the warm-up's short requests after 30 more), and the
	// gauge shows both decays.
	prefillTau, ctxTau, on := k.fp.Decays()
	lives := k.fp.ResidentLives
	if !on || lives <= 0 || ctxTau < time.Duration(lives*float64(shortest)/2) || ctxTau > time.Duration(lives*float64(longest)) {
		t.Errorf("contexts' decay %v (on %v, %v lives), want %v lives of a request between %v and %v", ctxTau, on, lives, lives, shortest, longest)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(kvCollector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gauges := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if mf.GetName() == "ramjet_kv_foreign_decay_seconds" && l["fleet"] == DefaultStateKey {
				gauges[l["estimate"]] = m.GetGauge().GetValue()
			}
		}
	}
	if len(gauges) != 2 || gauges["prefill"] <= 0 || gauges["context"] < ctxTau.Seconds()/2 {
		t.Errorf("ramjet_kv_foreign_decay_seconds of this fleet %v, want prefill > 0 and context about %v", gauges, ctxTau)
	}
	t.Logf("requests took %v-%v; decays: prefill %v, contexts %v", shortest, longest, prefillTau, ctxTau)
	got := k.fp.Decay()
	t.Logf("decay learned through engines %dx faster than real time: %v", scale, got)
	// At real time the simulator prefills 4096 (DefaultForeignTauTokens)
	// tokens in about 0.55 s; 4x faster, about 140 ms, plus the proxy's
	// and the preflight's wall-clock milliseconds per request (more under
	// load), and above the bound (Tau/TauRange) that would hide the
	// learning.
	lo, hi := selection.DefaultForeignTau/selection.TauRange, selection.DefaultForeignTau/2
	if got <= lo || got >= hi {
		t.Errorf("decay %v after %d first tokens from engines %dx faster, want in (%v, %v)", got, n, scale, lo, hi)
	}
}

// foreignShareGauge is ramjet_kv_foreign_share of the default fleet (-1:
// no such series).
func foreignShareGauge(t *testing.T) float64 {
	t.Helper()
	if m := collectorMetric(t, kvCollector(), "ramjet_kv_foreign_share", "fleet", DefaultStateKey); m != nil {
		return m.GetGauge().GetValue()
	}
	return -1
}
