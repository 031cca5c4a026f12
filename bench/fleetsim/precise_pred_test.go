package fleetsim

import (
	"flag"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

var precisePred = flag.String("precise-pred", "", "TestRamjetPrecisePredictionProbe: the workload (64 replicas, KV 196,608 tokens) whose decisions are replayed without their predicted entries")
var precisePredSeed = flag.Uint64("precise-pred-seed", 2, "TestRamjetPrecisePredictionProbe: the seed")

// predProbe is a RamjetPrecise that, before each decision, asks the
// router on the same state what it would pick with the exact overlaps as
// Annotate gives them (stored plus predicted entries) and with the stored
// entries alone, and records the decisions where the two differ.
type predProbe struct {
	*RamjetPrecise
	diffs   []predDiff
	decided int
	// replayMiss counts probed decisions whose pick with predictions is
	// not the one Route then made (the probe did not replay the state).
	replayMiss int
	// inPrefill is the number of requests routed and not yet at their
	// first token, per replica index.
	inPrefill map[int]int
	prefill   map[int]int // request ID -> replica, until its first token
}

type predDiff struct {
	id, prompt int
	at         float64
	// with: the pick with predictions; stored: without. ov/st: overlap
	// with predictions and stored only, ld the load score term; busy the
	// replica's requests still before their first token.
	with, stored                 int
	ovW, stW, ldW, ovS, stS, ldS int
	busyW, busyS                 int
}

func (p *predProbe) Pick(r *Request, fleet []*Replica) int {
	q := p.RamjetPrecise
	q.deliver(q.now)
	q.clock = max(q.clock, q.now)
	q.answers(q.now)
	if err := q.ensure(fleet); err != nil {
		panic(err)
	}
	probed := -2
	if q.pre.Ready() {
		q.features(r)
		cands := q.cands[:len(fleet)]
		s := q.s
		s.Tokens = r.Prompt
		if q.pre.Annotate(q.f, cands, s) {
			dW := q.rt.Pick(q.f, cands, s)
			probed = dW.Index
			ov := make([]int, len(cands))
			ld := make([]int, len(cands))
			for i := range cands {
				ov[i], ld[i] = s.Overlap[i], int(s.Load[i])
			}
			st := make([]int, len(cands))
			for i := range cands {
				if !cands[i].Precise {
					st[i] = cands[i].Overlap
					continue
				}
				n := 0
				for _, k := range s.Keys {
					if !q.x.Held(q.reps[i], k) {
						break
					}
					n++
				}
				st[i] = n * q.x.BlockSize()
				cands[i].Overlap = st[i]
			}
			dS := q.rt.Pick(q.f, cands, s)
			if dW.Index != dS.Index && dW.Index >= 0 && dS.Index >= 0 {
				p.diffs = append(p.diffs, predDiff{
					id: r.Row.ID, prompt: len(r.Prompt), at: q.now.Seconds(), with: dW.Index, stored: dS.Index,
					ovW: ov[dW.Index], stW: st[dW.Index], ldW: ld[dW.Index],
					ovS: ov[dS.Index], stS: st[dS.Index], ldS: ld[dS.Index],
					busyW: p.inPrefill[dW.Index], busyS: p.inPrefill[dS.Index],
				})
			}
			p.decided++
		}
		s.Tokens = nil
	}
	i := q.Pick(r, fleet)
	if probed != -2 && probed != i {
		p.replayMiss++
	}
	if i >= 0 {
		p.inPrefill[i]++
		p.prefill[r.Row.ID] = i
	}
	return i
}

func (p *predProbe) FirstToken(r *Request, rep int) {
	if i, ok := p.prefill[r.Row.ID]; ok {
		delete(p.prefill, r.Row.ID)
		p.inPrefill[i]--
	}
	p.RamjetPrecise.FirstToken(r, rep)
}

func (p *predProbe) Done(r *Request, rep int) {
	if i, ok := p.prefill[r.Row.ID]; ok {
		delete(p.prefill, r.Row.ID)
		p.inPrefill[i]--
	}
	p.RamjetPrecise.Done(r, rep)
}

// TestRamjetPrecisePredictionProbe logs the decisions of ramjet-precise
// that its predicted entries changed (the pick with the stored entries
// alone differs, on the same state) and how those requests fared, and
// checks that the probe replayed every decision (its pick with
// predictions is Route's) and that predictions changed at most 1% of
// them (issue 17: on main after the rule's lingering-context change,
// agent-fleet at 64 replicas with the reduced KV no longer loses to
// ramjet; seed 2 had 1 of 942). Off unless -precise-pred names a
// workload.
func TestRamjetPrecisePredictionProbe(t *testing.T) {
	if *precisePred == "" {
		t.Skip("set -precise-pred")
	}
	seed := *precisePredSeed
	w := generate(t, *precisePred, workload.Options{Seed: seed, Replicas: 64, Scale: 1})
	ec := engine.DefaultConfig()
	ec.CapacityTokens = 196608
	ec.MaxModelLen = 0 // DefaultMaxModelLen, as fleetsim runs it
	pp, err := NewRamjetPrecise(selection.Config{}, PreciseConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pp.setup.EngineLoad = RamjetEngineLoad // as NewPolicy("ramjet-precise@always")
	p := &predProbe{RamjetPrecise: pp, inPrefill: map[int]int{}, prefill: map[int]int{}}
	res, err := Run(Config{Workload: w, Replicas: 64, Engine: ec, Policy: p, Salt: seed})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(res)
	t.Logf("%s seed %d: %d precise decisions probed (precise %d, approximate %d), %d changed by predictions; p99 %.2f s, %.0f tok/s",
		w.Name, seed, p.decided, pp.PreciseDecisions(), pp.ApproxDecisions(), len(p.diffs), s.TTFTp99, s.OutputTPS)
	rec := map[int]Record{}
	for _, r := range res.Records {
		rec[r.ID] = r
	}
	for i, d := range p.diffs {
		if i >= 40 {
			break
		}
		r := rec[d.id]
		t.Logf("req %d at %.1fs (%d tok): with predictions -> %d (overlap %d, stored %d, load %d, %d before first token); stored only -> %d (overlap %d, stored %d, load %d, %d before first token); served cached %d, ttft %.2f s",
			d.id, d.at, d.prompt, d.with, d.ovW, d.stW, d.ldW, d.busyW, d.stored, d.ovS, d.stS, d.ldS, d.busyS, r.Cached, r.TTFT())
	}
	if p.replayMiss != 0 {
		t.Errorf("%d of %d probed decisions: the probe's pick is not Route's", p.replayMiss, p.decided)
	}
	if p.decided == 0 || len(p.diffs)*100 > p.decided {
		t.Errorf("predictions changed %d of %d precise decisions, want at most 1%%", len(p.diffs), p.decided)
	}
}
