package fleetsim

import (
	"slices"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

func TestParsePreciseSpec(t *testing.T) {
	tests := []struct {
		give    string
		want    preciseSpec
		ok      bool
		wantErr bool
	}{
		{"", preciseSpec{}, false, false},
		{"same", preciseSpec{}, false, false},
		{"inst=a", preciseSpec{}, false, false},
		{"cs", preciseSpec{cold: true}, true, false},
		{"fp", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens}, true, false},
		{"fp=0.5", preciseSpec{foreign: true, tau: 500 * time.Millisecond}, true, false},
		{"cs+band=1024+fp", preciseSpec{cold: true, band: 1024, foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens}, true, false},
		{"band=0", preciseSpec{}, true, true},
		{"fp=x", preciseSpec{}, true, true},
		{"cs+fpt=2048", preciseSpec{cold: true, foreign: true, tau: selection.DefaultForeignTau, tauTok: 2048}, true, false},
		{"fpt=0", preciseSpec{}, true, true},
		{"cs+same", preciseSpec{}, false, false},
		{"inst=host+cs+band=16384", preciseSpec{inst: "host", cold: true, band: 16384}, true, false},
		{"cs+inst=", preciseSpec{}, false, false},
		{"cs+fp+fpmin=480", preciseSpec{cold: true, foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, minRun: 480}, true, false},
		{"fp+fpmin=0", preciseSpec{}, true, true},
		{"fp+fpres=0", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, livesOn: true}, true, false},
		{"fp+fpq=0.5", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, prior: 0.5, priorOn: true}, true, false},
		{"fp+fpq=0", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, priorOn: true}, true, false},
		{"cs+kvd=40", preciseSpec{cold: true, kvDelay: 40 * time.Millisecond}, true, false},
		{"cs+kvd=0", preciseSpec{}, true, true},
		{"fp+fpq=-1", preciseSpec{}, true, true},
		{"fp+fpn=16384", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, qcost: 16384}, true, false},
		{"fp+fpn=0", preciseSpec{}, true, true},
		{"fp+fpn=16384+fpnw=0.5", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, qcost: 16384, qcWait: 500 * time.Millisecond}, true, false},
		{"fp+fpnw=0", preciseSpec{}, true, true},
		{"fp+fpn=16384+fpnw=0.5+fpnws=0.25", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, qcost: 16384, qcWait: 500 * time.Millisecond, qcWaitS: 0.25}, true, false},
		{"fp+fpnws=2", preciseSpec{}, true, true},
		{"fp+fpn=x", preciseSpec{}, true, true},
		{"fp+fpres=1.5+fplife=10", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, lives: 1.5, livesOn: true, life: 10 * time.Second}, true, false},
		{"fp+fpres=-1", preciseSpec{}, true, true},
		{"fp+fplife=0", preciseSpec{}, true, true},
		{"cs+band=1024+oracle", preciseSpec{cold: true, band: 1024, oracle: true}, true, false},
		{"fp+oracle", preciseSpec{}, true, true},
		{"cs+oracle=20", preciseSpec{cold: true, oracle: true, delay: 20 * time.Millisecond}, true, false},
		{"oracle=0", preciseSpec{}, true, true},
		{"fp+fpwhole", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, whole: true}, true, false},
		{"fp+fpwhole=3+fpearly", preciseSpec{foreign: true, tau: selection.DefaultForeignTau, tauTok: selection.DefaultForeignTauTokens, whole: true, wholeMx: 3, early: true}, true, false},
		{"fp+fpwhole=0.5", preciseSpec{}, true, true},
		{"cs+eq=16384", preciseSpec{cold: true, queue: 16384}, true, false},
		{"eq=0", preciseSpec{}, true, true},
		{"eq=32768+eqsat=0.25", preciseSpec{queue: 32768, qSat: 0.25}, true, false},
		{"eq=32768+eqsat=0", preciseSpec{}, true, true},
		{"eq=x", preciseSpec{}, true, true},
	}
	for _, tt := range tests {
		got, ok, err := parsePreciseSpec(tt.give)
		if (err != nil) != tt.wantErr || ok != tt.ok || (!tt.wantErr && got != tt.want) {
			t.Errorf("parsePreciseSpec(%q) = %+v, %v, %v; want %+v, %v, error %v", tt.give, got, ok, err, tt.want, tt.ok, tt.wantErr)
		}
	}
	if _, err := NewMulti("ramjet~cs", 2, FrontRoundRobin, 1, selection.Config{}); err == nil {
		t.Error("NewMulti(ramjet~cs): no error (the variants need the precise path)")
	}
}

// The precise variants change nothing for one instance: routing is the
// single policy's, record for record. The others' prefill estimate runs
// on a lone instance too (the module's foreign_prefill does) and finds its
// own stored runs its own.
func TestMultiPreciseVariantsOneInstance(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 1, Scale: 0.1})
	single, err := NewPolicy("ramjet-precise", 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := runPolicy(t, w, single, 4, 1)
	lone := newMulti(t, "ramjet-precise~cs+band=1024+fp", 1, FrontRoundRobin, 1)
	got := runPolicy(t, w, lone, 4, 1)
	rp := multiOf(lone).inst[0].(*RamjetPrecise)
	if rp.fp == nil {
		t.Fatal("a lone instance with fp has no estimate")
	}
	tok, runs := rp.fp.Counted()
	t.Logf("lone instance: %d tokens in %d runs counted as foreign", tok, runs)
	if len(want.Records) != len(got.Records) {
		t.Fatalf("%d records, want %d", len(got.Records), len(want.Records))
	}
	for i := range want.Records {
		if want.Records[i] != got.Records[i] {
			t.Fatalf("record %d differs: single %+v, variant x1 %+v", i, want.Records[i], got.Records[i])
		}
	}
}

// With several instances, the foreign prefill estimate sees the other
// instances' prefill (each instance's router is handed some), and the
// variant's instances each spread the 12-request burst over at least 7 of
// 8 replicas. The counting instances wait for every preflight (@always):
// under the default wait rule instances 2 and 3 count no foreign prefill
// here; the burst is spread under the default.
func TestMultiPreciseVariantsSeveral(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 1, Scale: 0.1})
	p := newMulti(t, "ramjet-precise@always~cs+band=1024+fp", 4, FrontRoundRobin, 1)
	runPolicy(t, w, p, 4, 1)
	m := multiOf(p)
	for k, p := range m.inst {
		rp := p.(*RamjetPrecise)
		if rp.fp == nil {
			t.Fatalf("instance %d has no estimate", k)
		}
		if o := rp.rt.Options(); !o.ColdSpill || o.SpillBand != 1024 {
			t.Fatalf("instance %d options %+v", k, o)
		}
		if tok, runs := rp.fp.Counted(); tok == 0 || runs == 0 {
			t.Errorf("instance %d counted no foreign prefill (%d tokens, %d runs): the index's stored runs do not reach it", k, tok, runs)
		}
	}
	if used := burstSpreadOf(t, "ramjet-precise~cs+band=1024", 4); used < 7 {
		t.Errorf("4 precise instances with the band: burst over %d of 8 replicas, want >= 7", used)
	}
}

// A lone instance named by a host name ("inst=<id>") is not at spill
// position 0: the variants apply to it (its router carries them), as they
// would to a lone module instance whose instance_id is its host name.
func TestMultiPreciseVariantsNamedLone(t *testing.T) {
	p := newMulti(t, "ramjet-precise~inst=ramjet-7f9c+cs+band=16384", 1, FrontRoundRobin, 1)
	rp := multiOf(p).inst[0].(*RamjetPrecise)
	if o := rp.rt.Options(); !o.ColdSpill || o.SpillBand != 16384 {
		t.Errorf("options %+v", o)
	}
	if rp.rt.Instance() != selection.InstancePosition("ramjet-7f9c") || rp.rt.Instance() == 0 {
		t.Errorf("position %x, want ramjet-7f9c's", rp.rt.Instance())
	}
}

// The burst over 4 instances with the cold spill and the others' prefill
// estimate (issue 13's >= 7 of 8). (Bands of 8192 and 16384 tokens, which
// cover the blind window as well, put it over 5 of 8: bench/RESULTS.md.)
func TestMultiBurstColdForeign(t *testing.T) {
	for _, v := range []string{"ramjet-precise~cs+fp", "ramjet-precise~cs+fp+fpmin=480", "ramjet-precise~cs+band=1024+fp"} {
		if used := burstSpreadOf(t, v, 4); used < 7 {
			t.Errorf("%s: burst over %d of 8 replicas, want >= 7", v, used)
		}
	}
}

// The same burst on the precise path's default (kv_events) with instances
// named by host names (the module's default instance_id: hashed spill
// positions, a Deployment's pods) rather than ordinals: issue 13's >= 7
// of 8 holds for 10 of 20 name sets (4-8 replicas; the default path's
// TestMultiBurstHashedInstances: 7 of 20), so the bar is met with ordinal
// instance_ids (a StatefulSet's pods, or instance_id ramjet-0..3), not
// with the host names of a Deployment's pods. The figure per name set is
// logged; the upper median must stay >= 6.
func TestMultiBurstColdForeignHashed(t *testing.T) {
	hashedBurstSpread(t, "ramjet-precise~cs+band=1024+fp+inst=host-%c%d")
}

// The oracle experiment hands each instance exactly the pending prefill
// the others reserved, replica by replica, and nothing of its own.
func TestMultiOracleSharesPending(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 1, Scale: 0.05})
	p := newMulti(t, "ramjet-precise~cs+band=1024+oracle", 3, FrontRoundRobin, 1)
	runPolicy(t, w, p, 4, 1)
	m := multiOf(p)
	if !m.oracle {
		t.Fatal("oracle spec not applied")
	}
	rp := func(k int) *RamjetPrecise { return m.inst[k].(*RamjetPrecise) }
	// After the run nothing is pending; reserve on instances 0 and 2.
	r0 := rp(0).rt.Reserve(rp(0).cands[1].Slot, 5000)
	r2 := rp(2).rt.Reserve(rp(2).cands[1].Slot, 700)
	r2b := rp(2).rt.Reserve(rp(2).cands[3].Slot, 300)
	defer func() { r0.Release(); r2.Release(); r2b.Release() }()
	m.sharePending(1)
	for i, want := range []int64{0, 5700, 0, 300} {
		if got := rp(1).rt.ExternalPrefill(rp(1).cands[i].Slot); got != want {
			t.Errorf("instance 1, replica %d: external prefill %d, want %d", i, got, want)
		}
	}
	m.sharePending(0)
	if got := rp(0).rt.ExternalPrefill(rp(0).cands[1].Slot); got != 700 {
		t.Errorf("instance 0, replica 1: external prefill %d, want 700 (its own 5000 left out)", got)
	}
}

// The delayed oracle knows another instance's request only once it was
// routed at least the delay ago, and forgets it at its first token.
func TestMultiOracleDelay(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 1, Scale: 0.05})
	p := newMulti(t, "ramjet-precise~cs+band=1024+oracle=50", 2, FrontRoundRobin, 1)
	runPolicy(t, w, p, 4, 1)
	m := multiOf(p)
	if len(m.pend) != 0 {
		t.Fatalf("%d requests still pending after the run", len(m.pend))
	}
	slot := func(k, i int) selection.Slot { return m.inst[k].(*RamjetPrecise).cands[i].Slot }
	ext := func(k, i int) int64 { return m.inst[k].(*RamjetPrecise).rt.ExternalPrefill(slot(k, i)) }
	m.now = 10 * time.Second
	m.pend[1] = pendingPrefill{inst: 0, rep: 2, at: m.now - 60*time.Millisecond, prefill: 4000}
	m.pend[2] = pendingPrefill{inst: 0, rep: 2, at: m.now - 10*time.Millisecond, prefill: 900} // too recent
	m.pend[3] = pendingPrefill{inst: 1, rep: 2, at: m.now - time.Second, prefill: 800}         // instance 1's own
	m.sharePending(1)
	if got := ext(1, 2); got != 4000 {
		t.Errorf("instance 1, replica 2: external prefill %d, want 4000", got)
	}
	m.FirstToken(&Request{Row: workload.Request{ID: 1}}, 2)
	m.sharePending(1)
	if got := ext(1, 2); got != 0 {
		t.Errorf("after the first token: external prefill %d, want 0", got)
	}
}

// firstTurnsMax runs agent-fleet at 8 replicas (scale 0.5, seed) through
// 4 instances of spec behind a round-robin front and returns the most
// agents' first turns any one replica took (of 48), and the run.
func firstTurnsMax(t *testing.T, spec string, seed uint64) (int, *Result) {
	t.Helper()
	w := generate(t, "agent-fleet", workload.Options{Seed: seed, Replicas: 8, Scale: 0.5})
	p := newMulti(t, spec, 4, FrontRoundRobin, seed)
	res := runPolicy(t, w, p, 8, seed)
	per := make([]int, 8)
	for _, r := range res.Records {
		if w.Trace[r.ID].Turn == 0 && r.Replica >= 0 {
			per[r.Replica]++
		}
	}
	t.Logf("%s x4, seed %d: first turns per replica %v", spec, seed, per)
	return slices.Max(per), res
}

// The first-turn pile-up (bench/RESULTS.md, 2026-12-05, "the first-turn
// pile-up"): at start-up, while one replica is the only one warm with the
// agents' shared 20k-token prefix, each instance sees only its own
// requests queued behind that prefix's prefill (the others' store nothing
// until their prefill runs) and sends its new agents there too. On seed
// 25, 4 instances put 11 of the 48 agents on one replica (p99 20 s) with
// the stored runs alone (foreign_prefill on, fpq=0); with the others'
// queues counted as the module now does by default (fp alone: fpq=1,
// selection.DefaultForeignPrior) at most 7 (one instance: 10). Both wait
// for every preflight (@always), as measured then; under the default wait
// rule fpq=0 too puts at most 7 there.
func TestMultiFirstTurnsSpread(t *testing.T) {
	if testing.Short() {
		t.Skip("two agent-fleet runs")
	}
	got, _ := firstTurnsMax(t, "ramjet-precise@always~cs+band=1024+fp", 25)
	if got > 9 {
		t.Errorf("the module's default: %d first turns on one replica, want at most 9", got)
	}
	if on, _ := firstTurnsMax(t, "ramjet-precise@always~cs+band=1024+fp+fpq=0", 25); on < 10 {
		t.Errorf("the stored runs alone (foreign_prefill on): %d first turns on one replica; the pile-up this test guards against is gone, re-check it", on)
	}
}

// The engines' queue cost ("eq", selection.Options.EngineQueue) reaches
// every instance's router; a lone instance, which sent every request its
// engines queue, routes as without it, record for record, with the
// engines scraped every 250 ms; two instances see each other's requests.
func TestMultiPreciseEngineQueue(t *testing.T) {
	w := generate(t, "agent-fleet", workload.Options{Seed: 1, Scale: 0.1})
	const base = "ramjet-precise~cs+band=1024+fp"
	run := func(name string, routers int) (*Result, *Multi) {
		t.Helper()
		p := newMulti(t, name, routers, FrontRoundRobin, 1)
		m := multiOf(p)
		for _, q := range m.inst {
			q.(*RamjetPrecise).setup.EngineLoad = 250 * time.Millisecond
		}
		return runPolicy(t, w, p, 8, 1), m
	}
	want, _ := run(base, 1)
	got, m := run(base+"+eq=16384", 1)
	rp := m.inst[0].(*RamjetPrecise)
	if o := rp.rt.Options(); o.EngineQueue != 16384 || !o.ColdSpill {
		t.Fatalf("lone instance's options %+v", o)
	}
	if rp.Scrapes() == 0 || rp.ExternalSeen() != 0 {
		t.Fatalf("lone instance: %d scrapes, %d external requests seen; want some, none", rp.Scrapes(), rp.ExternalSeen())
	}
	if len(want.Records) != len(got.Records) {
		t.Fatalf("%d records, want %d", len(got.Records), len(want.Records))
	}
	for i := range want.Records {
		if want.Records[i] != got.Records[i] {
			t.Fatalf("record %d differs: without %+v, with eq %+v", i, want.Records[i], got.Records[i])
		}
	}
	_, m = run(base+"+eq=16384", 2)
	for k, q := range m.inst {
		rp := q.(*RamjetPrecise)
		if o := rp.rt.Options(); o.EngineQueue != 16384 {
			t.Errorf("instance %d options %+v", k, o)
		}
		if rp.ExternalSeen() == 0 {
			t.Errorf("instance %d saw none of the other's requests", k)
		}
	}
}

// Under the wait rule four precise instances see each other from the
// engines' stored runs (the others' prefill estimate's evidence), which
// needs no waiting decision: every instance binds its slots to the feeds
// though its first decision was routed at once (before, instances 1-3
// never bound a slot, counted no foreign run and routed by the estimate
// to the end: here instances 2 and 3; on tool-agent at 8 replicas x4,
// TTFT p50 34x one instance's),
// so each counts foreign runs, sees the others and then waits. A lone
// instance counts none and keeps routing at once.
func TestMultiWaitRuleSeesOthers(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 1, Scale: 0.1})
	n := len(w.Trace)
	p := newMulti(t, "ramjet-precise@wait~cs+band=1024+fp", 4, FrontRoundRobin, 1)
	runPolicy(t, w, p, 4, 1)
	for k, ip := range multiOf(p).inst {
		rp := ip.(*RamjetPrecise)
		tok, runs := rp.fp.Counted()
		if tok == 0 || runs == 0 || !rp.rt.SawOthers() {
			t.Errorf("instance %d: %d foreign tokens in %d runs, saw others %v: want the other's runs and sight of it", k, tok, runs, rp.rt.SawOthers())
		}
		if rp.PreciseDecisions() == 0 || rp.Misses*4 > rp.PreciseDecisions() {
			t.Errorf("instance %d: %d precise decisions, %d routed at once: want it waiting once it saw the other", k, rp.PreciseDecisions(), rp.Misses)
		}
	}
	one := newMulti(t, "ramjet-precise@wait~cs+band=1024+fp", 1, FrontRoundRobin, 1)
	runPolicy(t, w, one, 4, 1)
	rp := multiOf(one).inst[0].(*RamjetPrecise)
	if tok, _ := rp.fp.Counted(); rp.rt.SawOthers() || tok != 0 || rp.Misses*10 < n*9 {
		t.Errorf("lone instance: saw others %v, %d foreign tokens, %d of %d routed at once: want none, 0, nearly all", rp.rt.SawOthers(), tok, rp.Misses, n)
	}
}
