package fleetsim

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestRamjetPreciseMissedPreflights: with a share of preflights missing
// their timeout, those requests are routed by the estimate, and (unless
// NoLate) their late answers hold the chosen replica's blocks until the
// request ends; predictions of requests that ended are released, so none
// is left once every request finished.
func TestRamjetPreciseMissedPreflights(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 2, Scale: 0.1})
	run := func(pc PreciseConfig) *RamjetPrecise {
		p, err := NewRamjetPrecise(selection.Config{}, pc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(Config{Workload: w, Replicas: 4, Policy: p, Salt: 2}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	late := run(PreciseConfig{TokenizeMiss: 0.25})
	noLate := run(PreciseConfig{TokenizeMiss: 0.25, NoLate: true})
	n := len(w.Trace)
	if late.Misses*8 < n || late.Misses*3 > n {
		t.Errorf("%d of %d preflights missed, want about a quarter", late.Misses, n)
	}
	if late.LateHolds == 0 || noLate.LateHolds != 0 {
		t.Errorf("late holds %d (want > 0), without late answers %d (want 0)", late.LateHolds, noLate.LateHolds)
	}
	if late.PreciseDecisions()+late.ApproxDecisions()+late.Misses != n {
		t.Errorf("precise %d + approximate %d + missed %d decisions, want %d", late.PreciseDecisions(), late.ApproxDecisions(), late.Misses, n)
	}
	// Every request ended: what is still predicted is in its grace, and
	// past it nothing is.
	if len(late.held) != 0 || len(late.routed) != 0 {
		t.Errorf("%d holds and %d routed requests left after the run", len(late.held), len(late.routed))
	}
	late.clock += DefaultPredictGrace + time.Second
	if got := late.Index().Predicted(); got != 0 {
		t.Errorf("%d predictions left past the grace after every request ended", got)
	}
	if _, err := NewRamjetPrecise(selection.Config{}, PreciseConfig{TokenizeMiss: 1.5}); err == nil {
		t.Error("a tokenize miss share of 1.5 was accepted")
	}
}

var preciseMissTable = flag.String("precise-miss-table", "", "TestRamjetPreciseMissTable: comma-separated workloads to run at full scale, seeds 1-3")

// TestRamjetPreciseMissTable logs, per workload and seed (8 replicas, the
// default engine), ramjet against ramjet-precise with every preflight in
// time, with 22% of them missing the timeout as before kvindex.Late (their
// answers dropped, predictions for 2 s), and with the misses' late answers
// held until the request ends. Off unless -precise-miss-table names the
// workloads.
func TestRamjetPreciseMissTable(t *testing.T) {
	if *preciseMissTable == "" {
		t.Skip("set -precise-miss-table")
	}
	variants := []struct {
		name string
		pc   *PreciseConfig
	}{
		{"ramjet", nil},
		{"precise, preflights in time", &PreciseConfig{}},
		{"precise, 22% missed, before (answers dropped, 2 s TTL)", &PreciseConfig{TokenizeMiss: 0.22, NoLate: true, PredictTTL: 2 * time.Second}},
		{"precise, 22% missed, late answers held", &PreciseConfig{TokenizeMiss: 0.22}},
	}
	t.Log("| workload | seed | variant | cached share | TTFT p50 s | TTFT p95 s | TTFT p99 s | output tok/s | misses | late holds |")
	t.Log("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, name := range strings.Split(*preciseMissTable, ",") {
		for _, seed := range []uint64{1, 2, 3} {
			w := generate(t, name, workload.Options{Seed: seed, Replicas: 8, Scale: 1})
			for _, v := range variants {
				var pol Policy
				var pre *RamjetPrecise
				var err error
				if v.pc == nil {
					pol, err = NewRamjet(selection.Config{})
				} else {
					pre, err = NewRamjetPrecise(selection.Config{}, *v.pc)
					pol = pre
				}
				if err != nil {
					t.Fatal(err)
				}
				res, err := Run(Config{Workload: w, Replicas: 8, Engine: engine.DefaultConfig(), Policy: pol, Salt: seed})
				if err != nil {
					t.Fatal(err)
				}
				s := Summarize(res)
				misses, holds := 0, 0
				if pre != nil {
					misses, holds = pre.Misses, pre.LateHolds
				}
				t.Logf("| %s | %d | %s | %.3f | %.3f | %.2f | %.2f | %.0f | %d | %d |", name, seed, v.name,
					s.CachedShare, s.TTFTp50, s.TTFTp95, s.TTFTp99, s.OutputTPS, misses, holds)
			}
		}
	}
}

var preciseDiverge = flag.String("precise-diverge", "", "TestRamjetPreciseDiverge: the workload (seed 3, 8 replicas) whose first decisions where ramjet and ramjet-precise differ are logged")

// recordingPolicy records every decision's per-candidate overlap and load.
type recordingPolicy struct {
	Policy
	rj   *Ramjet
	pick map[int]int
	recs map[int]string
}

func (p *recordingPolicy) Pick(r *Request, fleet []*Replica) int {
	i := p.Policy.Pick(r, fleet)
	p.pick[r.Row.ID] = i
	p.recs[r.Row.ID] = fmt.Sprintf("overlap %v load %v", p.rj.s.Overlap, p.rj.s.Load)
	return i
}

// recordingPrecise keeps the precise policy's simulated-time hooks.
type recordingPrecise struct {
	*recordingPolicy
	p *RamjetPrecise
}

func (w recordingPrecise) attach(rep int, e *engine.Engine) { w.p.attach(rep, e) }
func (w recordingPrecise) setNow(now time.Duration)         { w.p.setNow(now) }
func (w recordingPrecise) Done(r *Request, rep int)         { w.p.Done(r, rep) }

// TestRamjetPreciseDiverge logs the first five requests that ramjet and
// ramjet-precise route differently, with every candidate's overlap (the
// estimate's, or the exact one) and load: where the two indexes disagree.
// Off unless -precise-diverge names a workload.
func TestRamjetPreciseDiverge(t *testing.T) {
	if *preciseDiverge == "" {
		t.Skip("set -precise-diverge")
	}
	w := generate(t, *preciseDiverge, workload.Options{Seed: 3, Replicas: 8, Scale: 1})
	a, _ := NewRamjet(selection.Config{})
	b, _ := NewRamjetPrecise(selection.Config{}, PreciseConfig{})
	ra := &recordingPolicy{Policy: a, rj: a, pick: map[int]int{}, recs: map[int]string{}}
	rb := &recordingPolicy{Policy: b, rj: b.Ramjet, pick: map[int]int{}, recs: map[int]string{}}
	for _, p := range []Policy{ra, recordingPrecise{rb, b}} {
		if _, err := Run(Config{Workload: w, Replicas: 8, Engine: engine.DefaultConfig(), Policy: p, Salt: 3}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for id := 0; id < len(w.Trace) && n < 5; id++ {
		if ra.pick[id] != rb.pick[id] {
			t.Logf("request %d (%d prompt tokens): ramjet -> %d, %s; ramjet-precise -> %d, %s",
				id, w.Trace[id].Input, ra.pick[id], ra.recs[id], rb.pick[id], rb.recs[id])
			n++
		}
	}
}

// TestRamjetPreciseColdStart: the decisions made before any feed is fresh
// (the cold start) still get their background preflight, whose answer
// holds the chosen replica's blocks (kvindex.Precise.ColdPreflight);
// NoCold, and NoLate, send none.
func TestRamjetPreciseColdStart(t *testing.T) {
	w := generate(t, "agent-fleet", workload.Options{Seed: 1, Scale: 0.1})
	run := func(pc PreciseConfig) *RamjetPrecise {
		p, err := NewRamjetPrecise(selection.Config{}, pc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(Config{Workload: w, Replicas: 8, Policy: p, Salt: 1}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cold, noCold, noLate := run(PreciseConfig{}), run(PreciseConfig{NoCold: true}), run(PreciseConfig{NoLate: true})
	if cold.ColdHolds == 0 || noCold.ColdHolds != 0 || noLate.ColdHolds != 0 {
		t.Errorf("cold-start holds %d (want > 0), with NoCold %d, with NoLate %d (want 0)", cold.ColdHolds, noCold.ColdHolds, noLate.ColdHolds)
	}
	if cold.ColdHolds > cold.ApproxDecisions() {
		t.Errorf("%d cold-start holds from %d decisions routed by the estimate", cold.ColdHolds, cold.ApproxDecisions())
	}
	if len(cold.held) != 0 {
		t.Errorf("%d holds left after the run", len(cold.held))
	}
	cold.clock += DefaultPredictGrace + time.Second
	if got := cold.Index().Predicted(); got != 0 {
		t.Errorf("%d predictions left past the grace after every request ended", got)
	}
	t.Logf("cold-start holds %d of %d decisions", cold.ColdHolds, len(w.Trace))
}

// TestRamjetPreciseWaitRule: ramjet-precise@wait routes by the estimate
// every decision the module's wait rule (kvindex.Precise.WaitPreflight)
// would not wait for: here all but the cold start's, a lone instance
// whose engines drop nothing; their answers, one round trip later, hold
// the chosen replicas' blocks as a missed preflight's do.
func TestRamjetPreciseWaitRule(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 2, Scale: 0.1})
	q, err := NewPolicy("ramjet-precise@wait", 2, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := q.(*RamjetPrecise)
	if _, err := Run(Config{Workload: w, Replicas: 4, Policy: p, Salt: 2}); err != nil {
		t.Fatal(err)
	}
	n := len(w.Trace)
	if p.Index().Removed() != 0 {
		t.Fatalf("%d blocks removed: the rule's case needs none", p.Index().Removed())
	}
	if p.Misses*10 < n*9 || p.LateHolds == 0 || p.PreciseDecisions() != 0 {
		t.Errorf("%d of %d routed at once (want nearly all), %d late holds (want > 0), %d precise decisions (want 0)",
			p.Misses, n, p.LateHolds, p.PreciseDecisions())
	}
	if p.PreciseDecisions()+p.ApproxDecisions()+p.Misses != n {
		t.Errorf("precise %d + approximate %d + at once %d decisions, want %d", p.PreciseDecisions(), p.ApproxDecisions(), p.Misses, n)
	}
}

// TestRamjetPreciseNames: a ramjet-precise name applies the wait rule
// (the default; flagged wait or not), its answers one round trip
// (WaitRuleLate) later; one flagged always waits for every preflight (a
// later flag wins).
func TestRamjetPreciseNames(t *testing.T) {
	for _, tt := range []struct {
		name string
		wait bool
	}{
		{"ramjet-precise", true},
		{"ramjet-precise@wait", true},
		{"ramjet-precise@nocold", true},
		{"ramjet-precise@nocold+wait", true},
		{"ramjet-precise@always", false},
		{"ramjet-precise@exact+always", false},
		{"ramjet-precise@wait+always", false},
		{"ramjet-precise@always+wait", true},
	} {
		q, err := NewPolicy(tt.name, 1, selection.Config{})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		p := q.(*RamjetPrecise)
		if p.pc.WaitRule != tt.wait || p.Name() != tt.name {
			t.Errorf("%s: wait rule %v, label %q; want %v, %q", tt.name, p.pc.WaitRule, p.Name(), tt.wait, tt.name)
		}
		if late := p.pc.TokenizeLate; tt.wait && late != WaitRuleLate {
			t.Errorf("%s: tokenize late %v, want %v", tt.name, late, WaitRuleLate)
		}
	}
	if _, err := NewPolicy("ramjet-precise@sometimes", 1, selection.Config{}); err == nil {
		t.Error("ramjet-precise@sometimes accepted")
	}
}
