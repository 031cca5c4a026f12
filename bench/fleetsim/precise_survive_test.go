package fleetsim

import (
	"flag"
	"sort"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

var preciseSurv = flag.String("precise-surv", "", "TestRamjetPreciseSurvivalProbe: the workload")
var preciseSurvSeed = flag.Uint64("precise-surv-seed", 4, "TestRamjetPreciseSurvivalProbe: the seed")
var preciseSurvReplicas = flag.Int("precise-surv-replicas", 8, "TestRamjetPreciseSurvivalProbe: replicas")

type survRow struct {
	id, prompt     int
	at             float64
	pick, approxPk int
	exact, approx  []int
	load           []float64
	pending        int64
}

type survProbe struct {
	*RamjetPrecise
	rows []survRow
}

func (p *survProbe) Pick(r *Request, fleet []*Replica) int {
	q := p.RamjetPrecise
	q.deliver(q.now)
	q.clock = max(q.clock, q.now)
	q.answers(q.now)
	if err := q.ensure(fleet); err != nil {
		panic(err)
	}
	var row *survRow
	if q.pre.Ready() {
		q.features(r)
		cands := q.cands[:len(fleet)]
		s := q.s
		s.Tokens = r.Prompt
		if q.pre.Annotate(q.f, cands, s) {
			dW := q.rt.Pick(q.f, cands, s)
			rw := survRow{id: r.Row.ID, prompt: len(r.Prompt), at: q.now.Seconds(), pick: dW.Index}
			rw.exact = append([]int(nil), s.Overlap...)
			rw.load = append([]float64(nil), s.Load...)
			for i := range cands {
				cands[i].Precise = false
			}
			dA := q.rt.Pick(q.f, cands, s)
			rw.approxPk = dA.Index
			rw.approx = append([]int(nil), s.Overlap...)
			_, rw.pending = q.rt.Load(cands[dW.Index].Slot)
			p.rows = append(p.rows, rw)
			row = &p.rows[len(p.rows)-1]
		}
		s.Tokens = nil
	}
	i := q.Pick(r, fleet)
	if row != nil && i != row.pick {
		panic("replay miss")
	}
	return i
}

func TestRamjetPreciseSurvivalProbe(t *testing.T) {
	if *preciseSurv == "" {
		t.Skip("set -precise-surv")
	}
	seed := *preciseSurvSeed
	n := *preciseSurvReplicas
	w := generate(t, *preciseSurv, workload.Options{Seed: seed, Replicas: n, Scale: 1})
	ec := engine.DefaultConfig()
	ec.MaxModelLen = 0
	pp, err := NewRamjetPrecise(selection.Config{}, PreciseConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pp.setup.EngineLoad = RamjetEngineLoad
	p := &survProbe{RamjetPrecise: pp}
	res, err := Run(Config{Workload: w, Replicas: n, Engine: ec, Policy: p, Salt: seed})
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(res)
	rec := map[int]Record{}
	for _, r := range res.Records {
		rec[r.ID] = r
	}
	var ex, ap, ca, in int
	diff := 0
	type bucket struct{ n, ex, ca, ap int }
	byPend := map[int]*bucket{}
	for _, rw := range p.rows {
		r := rec[rw.id]
		ex += rw.exact[rw.pick]
		ap += rw.approx[rw.pick]
		ca += r.Cached
		in += rw.prompt
		if rw.pick != rw.approxPk {
			diff++
		}
		k := int(rw.pending / 50000)
		b := byPend[k]
		if b == nil {
			b = &bucket{}
			byPend[k] = b
		}
		b.n++
		b.ex += rw.exact[rw.pick]
		b.ca += r.Cached
		b.ap += rw.approx[rw.pick]
	}
	t.Logf("%s seed %d: %d rows, p99 %.2f tok/s %.0f; on the pick: exact %.3f approx %.3f cached %.3f of input; %d picks differ from the approximate pick",
		w.Name, seed, len(p.rows), s.TTFTp99, s.OutputTPS, float64(ex)/float64(in), float64(ap)/float64(in), float64(ca)/float64(in), diff)
	ks := []int{}
	for k := range byPend {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	for _, k := range ks {
		b := byPend[k]
		t.Logf("pending %dk-%dk: n %d exact %d approx %d cached %d (per req)", k*50, k*50+50, b.n, b.ex/b.n, b.ap/b.n, b.ca/b.n)
	}
	for i, rw := range p.rows {
		if i%40 != 0 {
			continue
		}
		r := rec[rw.id]
		t.Logf("req %d at %.1f prompt %d -> %d (approx pick %d) exact %v approx %v load %v pending %d; cached %d ttft %.1f",
			rw.id, rw.at, rw.prompt, rw.pick, rw.approxPk, rw.exact, rw.approx, rw.load, rw.pending, r.Cached, r.TTFT())
	}
}
