package selection

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestQuietSlot checks what turns Pick's quiet case off: any load figure
// of the slot but its lingering context (loadCell.still) or an option
// that reads other state.
func TestQuietSlot(t *testing.T) {
	// Anything on the slot turns the quiet case off.
	rt, _ := newTestRouter(t, Config{}, 1)
	for name, set := range map[string]func(c *loadCell){
		"inflight": func(c *loadCell) { c.inflight.Store(1) },
		"pending":  func(c *loadCell) { c.pending.Store(1) },
		"resident": func(c *loadCell) { c.resident.Store(1) },
		"requests": func(c *loadCell) { c.ext.requests.Store(1) },
		"prefill":  func(c *loadCell) { c.ext.prefill.Store(1) },
		"kv":       func(c *loadCell) { c.ext.kv.Store(1) },
		"context":  func(c *loadCell) { c.extCtx.Store(1) },
	} {
		c := &rt.loads[0]
		*c = loadCell{}
		c.inflight.Store(5 << 32) // a generation alone is still
		c.linger.Store(300)       // and lingering context
		if !c.still() {
			t.Errorf("a generation and lingering context: not still")
		}
		set(c)
		if c.still() {
			t.Errorf("%s set: still", name)
		}
	}
	// Options that read other state keep the terms.
	for name, o := range map[string]Options{"shared once": {SharedOnce: true}, "once below": {OnceBelow: 2},
		"engine overflow": {EngineOverflow: true}, "engine queue": {EngineQueue: 1}} {
		if k := rt.WithOptions(o).loadKnobs(); k.quiet {
			t.Errorf("%s: quiet on", name)
		}
	}
}

// TestPickQuietMatchesTerms holds Pick's quiet case (a replica holding
// none of the prompt with nothing on it but lingering context, scored by
// the pair term on that and the overflow term alone) to the full terms,
// bit for bit: over a run of routed, observed
// and released requests on fleets with small and unknown capacities,
// others' load, profiles and output lengths, under the rule and options
// that add per-replica terms, every decision and every candidate's load
// and score are the same with the quiet case off.
func TestPickQuietMatchesTerms(t *testing.T) {
	for name, o := range map[string]Options{
		"rule":       {},
		"cold away":  {ColdAway: 2 * time.Second},
		"queue warm": {QueueExtraWarm: true, QueueExtraFull: -1},
		"pair":       {PairEverywhere: true, OverflowHome: -1, HotGuard: -1},
		"pair forms": {PairSat: true, PairSqrt: true, PairShare: true, LingerCap: 0.25, PairCap: 0.5, PairFloor: -1},
		"half-life":  {LingerHalfLife: 3 * time.Second, LingerCap: 2},
	} {
		t.Run(name, func(t *testing.T) {
			base, cands := newTestRouter(t, Config{}, 12)
			var clock time.Duration // both Picks of a step read the same time
			base.SetClock(func() time.Duration { return clock })
			rt := base.WithOptions(o)
			full := *rt
			full.lk.quiet = false
			rng := rand.New(rand.NewPCG(3, uint64(len(name))))
			for i := range cands {
				cands[i].Profile = Profile(rng.IntN(2))
				switch rng.IntN(3) {
				case 0:
					rt.SetCapacity(cands[i].Slot, int64(64+rng.IntN(1024)))
				case 1:
					rt.SetCapacity(cands[i].Slot, 1<<20)
				}
			}
			c := rt.Config()
			var live []*Reservation
			s1, s2 := NewScratch(len(cands)), NewScratch(len(cands))
			quiet := 0
			for step := range 3000 {
				clock += time.Duration(rng.IntN(400)) * time.Millisecond
				for i := range cands {
					cands[i].Usable = rng.IntN(8) != 0
				}
				if rng.IntN(20) == 0 {
					sl := cands[rng.IntN(len(cands))].Slot
					rt.SetExternalLoad(sl, int64(rng.IntN(3)), int64(rng.IntN(2)), int64(rng.IntN(2000)))
				}
				f := features(c, blocksOf(uint64(rng.IntN(6+step/100)), 1+rng.IntN(40)), rng.IntN(3)*700)
				exact := rng.IntN(3) == 0
				for i := range cands {
					// In a third of the steps some exact overlaps, as an
					// annotator gives them: a home holding nearly all of a
					// prompt past its capacity.
					pt := f.PromptTokens(c)
					cands[i].Precise, cands[i].Overlap = exact && rng.IntN(4) == 0, pt-rng.IntN(pt/8+1)
				}
				got, want := rt.Pick(f, cands, s1), full.Pick(f, cands, s2)
				if got != want {
					t.Fatalf("step %d: decision %+v, with the terms %+v", step, got, want)
				}
				for i := range cands {
					if math.Float64bits(s1.Load[i]) != math.Float64bits(s2.Load[i]) ||
						math.Float64bits(s1.Score[i]) != math.Float64bits(s2.Score[i]) || s1.Overlap[i] != s2.Overlap[i] {
						t.Fatalf("step %d candidate %d: load %v score %v, with the terms %v %v", step, i, s1.Load[i], s1.Score[i], s2.Load[i], s2.Score[i])
					}
					if lc := &rt.loads[cands[i].Slot]; cands[i].Usable && s1.Overlap[i] == 0 && lc.still() && lc.linger.Load() > 0 {
						quiet++ // lingering context only
					}
				}
				if rng.IntN(8) == 0 {
					rt.Learn(f, cands[rng.IntN(len(cands))].Slot) // a holder with nothing on it
				} else if _, res := rt.Route(f, cands, s1, nil, nil); res != nil {
					live = append(live, res)
				}
				for len(live) > 0 && rng.IntN(3) != 0 {
					k := rng.IntN(len(live))
					r := live[k]
					pt := f.PromptTokens(c)
					rt.Observe(r, pt, rng.IntN(pt+1), 10)
					r.Release()
					live = append(live[:k], live[k+1:]...)
				}
			}
			if quiet == 0 {
				t.Fatal("no quiet candidate with lingering context scored")
			}
		})
	}
}

// TestRunnerUp holds runnerUp to the max form it replaces, on scores with
// NaNs, infinities, signed zeros and repeats: the same best and index, and
// the same answer to whether the best but one is short of any tie limit.
func TestRunnerUp(t *testing.T) {
	vals := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1, -1, 2.5, 2.5, -7}
	rng := rand.New(rand.NewPCG(7, 9))
	for iter := range 20000 {
		n := 1 + rng.IntN(6)
		best, sec, top := math.Inf(-1), math.Inf(-1), -1
		wbest, wsec, wtop := math.Inf(-1), math.Inf(-1), -1
		for i := range n {
			sc := vals[rng.IntN(len(vals))]
			best, sec, top = runnerUp(sc, best, sec, top, i)
			if sc > wbest {
				wsec, wbest, wtop = max(wsec, wbest), sc, i
			} else {
				wsec = max(wsec, sc)
			}
		}
		if math.Float64bits(best) != math.Float64bits(wbest) || top != wtop || math.IsNaN(sec) != math.IsNaN(wsec) {
			t.Fatalf("iteration %d: best %v top %d sec %v, want %v %d %v", iter, best, top, sec, wbest, wtop, wsec)
		}
		for _, tied := range vals {
			if (sec < tied) != (wsec < tied) {
				t.Fatalf("iteration %d: sec %v, want %v, against %v", iter, sec, wsec, tied)
			}
		}
	}
}

// TestQuietLoadMatchesTerms checks loadWith's quiet case (quietLoad: a
// slot with nothing on it but lingering context) against the terms it
// skips, bit for bit: for prompts below and past the slot's KV capacity,
// with and without lingering context (fresh, decayed, past its TTL), the
// home's overflow exemption, the pair term on and off, a hit or none, and
// the options that change the terms.
func TestQuietLoadMatchesTerms(t *testing.T) {
	cfgs := map[string]func(*Config){
		"defaults": func(*Config) {},
		"no pair":  func(c *Config) { c.PairWeight, c.Explicit = 0, c.Explicit|KnobPairWeight },
		"context":  func(c *Config) { c.ContextWeight = 3 },
	}
	opts := map[string]Options{
		"rule":        {},
		"weight":      {OverflowWeight: 0.5},
		"no overflow": {OverflowWeight: -1}, // bare with "no pair"
		"forms":       {PairFloor: -1, PairSqrt: true, PairShare: true, PairSat: true},
		"caps":        {PairCap: 0.5, LingerCap: 0.25, LingerTTL: -1},
		"half-life":   {LingerHalfLife: 2 * time.Second},
		"no linger":   {NoLinger: true},
	}
	for cname, set := range cfgs {
		var c Config
		set(&c)
		for oname, o := range opts {
			base, _ := newTestRouter(t, c, 2)
			clock := 50 * time.Second
			base.SetClock(func() time.Duration { return clock })
			rt := base.WithOptions(o)
			rt.SetCapacity(1, 4096)
			k := rt.loadKnobs()
			if !k.quiet {
				t.Fatalf("%s/%s: quiet off", cname, oname)
			}
			now := rt.lingerClock(k.lingerOn, k.ttl)
			if now == 0 {
				now = rt.clockMS()
			}
			for _, s := range []Slot{0, 1} {
				for _, lg := range []struct {
					tokens int32
					ago    time.Duration
				}{{0, 0}, {3000, time.Second}, {70000, 5 * time.Second}, {500, time.Minute}} {
					cell := &rt.loads[s]
					cell.linger.Store(lg.tokens)
					cell.lingerAt.Store(uint32((clock - lg.ago) / time.Millisecond))
					if !cell.still() {
						t.Fatalf("slot %d not still", s)
					}
					for _, prompt := range []int{0, 1, 4000, 4096, 5000, 1 << 19} {
						for _, hit := range []int{-1, 0, 64} {
							for _, pairOn := range []bool{false, true} {
								for _, owOff := range []bool{false, true} {
									q := k
									q.owOff = owOff
									full := q
									full.quiet = false
									got, gn := rt.loadWith(&q, s, prompt, pairOn, now, hit)
									want, wn := rt.loadWith(&full, s, prompt, pairOn, now, hit)
									if math.Float64bits(got) != math.Float64bits(want) || gn != wn {
										t.Errorf("%s/%s slot %d linger %d prompt %d hit %d pair %v home %v: quiet %v (%d), terms %v (%d)",
											cname, oname, s, lg.tokens, prompt, hit, pairOn, owOff, got, gn, want, wn)
									}
								}
							}
						}
					}
				}
			}
		}
	}
}
