package kvindex

import (
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestPreciseCapQueue checks PreciseConfig.CapQueue: an exact overlap past
// the estimate's credit, on blocks this router routed there, stands on a
// replica whose pending prefill is below CapQueue times its KV capacity
// (opt-in, with CapLoad off, and here CapPeer, CapGain and CapFit off),
// and is left to the estimate on one queued past it, on one whose capacity
// is not known, and everywhere without the rule.
func TestPreciseCapQueue(t *testing.T) {
	now := time.Unix(100, 0)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // three full blocks
	for _, tc := range []struct {
		name string
		k    float64
		// want: whether a (no queue), b (queued past its capacity) and c
		// (no queue, capacity unknown) keep their exact overlap.
		wantA, wantB, wantC bool
	}{
		{"default", 0, false, false, false},
		{"once", 1, true, false, false},
		{"twice", 2, true, true, false}, // b's queue is under twice its capacity
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rt, cands := threeEstimated(t, PreciseConfig{Index: Config{BlockSize: 4, Now: func() time.Time { return now }}, CapQueue: tc.k, CapLoad: -1, CapPeer: -1, CapGain: -1, CapFit: -1})
			const capa = 400 // tokens: 100 router blocks
			rt.SetCapacity(cands[0].Slot, capa)
			rt.SetCapacity(cands[1].Slot, capa)
			// Every replica holds two blocks this router routed there
			// (predicted, then stored), which its estimate no longer
			// credits (it credits none).
			ownTwoBlocks(t, p.Index(), toks)
			f := promptOf(rt, toks)
			// A long cold prompt queued on b: its pending prefill (about 1.5
			// times b's capacity as the index applies it) is ahead of the
			// request.
			queued := coldQueued(rt, cands[1], int(1.5*float64(rt.Capacity(cands[1].Slot))))
			s := selection.NewScratch(3)
			if _, pend := rt.Load(cands[1].Slot); float64(pend) < float64(rt.Capacity(cands[1].Slot)) || float64(pend) >= 2*float64(rt.Capacity(cands[1].Slot)) || rt.Capacity(cands[2].Slot) != 0 {
				t.Fatalf("setup: b's pending %d against capacity %d; c's capacity %d (want unknown)", pend, rt.Capacity(cands[1].Slot), rt.Capacity(cands[2].Slot))
			}
			s.Tokens = toks
			annotateWant(t, p, f, cands, s, 8, tc.wantA, tc.wantB, tc.wantC)
			rt.Pick(f, cands, s)
			for i, want := range []bool{tc.wantA, tc.wantB, tc.wantC} {
				o := 0 // the estimate's credit
				if want {
					o = 8
				}
				if s.Overlap[i] != o {
					t.Errorf("Pick's overlap of %c %d, want %d", 'a'+i, s.Overlap[i], o)
				}
			}

			// b's queue reaches its first tokens: its exact overlap stands
			// under the rule.
			queued.PrefillDone()
			p.Annotate(f, cands, s)
			if cands[1].Precise != (tc.k > 0) {
				t.Errorf("b without a queue: %+v, want precise %v", cands[1], tc.k > 0)
			}
			queued.Release()
		})
	}
}

// threeEstimated is a Precise of cfg over three bound replicas a, b and c
// with the estimate of a router of 4-token blocks (SetEstimate), that
// router, and its candidates in that order.
func threeEstimated(t *testing.T, cfg PreciseConfig) (*Precise, *selection.Router, []selection.Candidate) {
	t.Helper()
	p, rt, slots := estimatedOn(t, cfg, 3, "a", "b", "c")
	cands := make([]selection.Candidate, len(slots))
	for i, s := range slots {
		cands[i] = selection.Candidate{Slot: s, Usable: true}
	}
	return p, rt, cands
}

// estimatedOn is a Precise of cfg over engines of the replicas names with
// the estimate of a router of 4-token blocks (SetEstimate), that router,
// and the replicas' slots in names' order; the first bound of them are
// bound to their feeds (Bind), the others registered only.
func estimatedOn(t *testing.T, cfg PreciseConfig, bound int, names ...string) (*Precise, *selection.Router, []selection.Slot) {
	t.Helper()
	cfg.Engines = nil
	for _, k := range names {
		cfg.Engines = append(cfg.Engines, PreciseEngine{Feed: Endpoint{Replica: k}})
	}
	p, err := NewPrecise(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := selection.NewRouter(selection.Config{BlockTokens: 4, PrefixTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	p.SetEstimate(rt)
	slots := make([]selection.Slot, len(names))
	for i, k := range names {
		slots[i], _ = rt.Register(k)
		if i < bound {
			p.Bind(slots[i], k)
		}
	}
	return p, rt, slots
}

// TestPreciseCapLoad checks PreciseConfig.CapLoad: an exact overlap past
// the estimate's credit, on blocks this router routed there, stands while
// the replica's in-flight requests and this one, each weighed as this
// prompt, fit in CapLoad times its KV capacity (0: DefaultCapLoad), counting
// requests past their prefill (which CapQueue does not); capped past it,
// with the capacity unknown, and everywhere with CapLoad off (-1). CapPeer,
// CapGain and CapFit are off here.
func TestPreciseCapLoad(t *testing.T) {
	now := time.Unix(100, 0)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // 13 tokens
	for _, tc := range []struct {
		name                string
		k                   float64
		wantA, wantB, wantC bool // a idle, b three decoding requests, c capacity unknown
	}{
		{"off", -1, false, false, false},
		{"default", 0, true, true, false},  // DefaultCapLoad, 3
		{"tenth", 0.1, true, false, false}, // 40 tokens: a's 13 fit, b's 4 x 13 do not
		{"once", 1, true, true, false},
		{"three", 3, true, true, false}, // the measured value
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rt, cands := threeEstimated(t, PreciseConfig{Index: Config{BlockSize: 4, Now: func() time.Time { return now }}, CapLoad: tc.k,
				CapPeer: -1, CapGain: -1, CapFit: -1})
			rt.SetCapacity(cands[0].Slot, 400)
			rt.SetCapacity(cands[1].Slot, 400)
			ownTwoBlocks(t, p.Index(), toks)
			held := threeDecoding(rt, cands[1]) // no pending prefill, three in flight
			if inf, pend := rt.Load(cands[1].Slot); inf != 3 || pend != 0 {
				t.Fatalf("setup: b in flight %d, pending %d; want 3, 0", inf, pend)
			}
			f := promptOf(rt, toks)
			s := selection.NewScratch(3)
			s.Tokens = toks
			annotateWant(t, p, f, cands, s, 8, tc.wantA, tc.wantB, tc.wantC)
			// b's requests end: its exact overlap stands under the rule.
			for _, r := range held {
				r.Release()
			}
			p.Annotate(f, cands, s)
			if cands[1].Precise != (tc.k >= 0) {
				t.Errorf("b idle: %+v, want precise %v", cands[1], tc.k >= 0)
			}
		})
	}
}

// ownTwoBlocks has replicas a, b and c of x hold toks' first two blocks
// (of 4 tokens) as this router's: predicted, then stored, then released.
func ownTwoBlocks(t *testing.T, x *Index, toks []uint32) {
	t.Helper()
	keys := x.Keys(nil, 0, toks)
	for i, k := range []string{"a", "b", "c"} {
		r, _ := x.Lookup(k)
		x.Hold(r, keys[:2], time.Minute)
		x.Apply(r, batchOf(storedEv(0, false, 4, toks[:8], uint64(11+10*i), uint64(12+10*i))))
		x.Release(r, keys[:2], 0)
		if !x.Own(r, keys[1]) {
			t.Fatalf("%s: own %v, want true", k, x.Own(r, keys[1]))
		}
	}
}

// annotateWant annotates cands for f and checks which of them (a, b, c in
// order) keep their exact overlap, exact tokens long, as precise.
func annotateWant(t *testing.T, p *Precise, f *selection.Features, cands []selection.Candidate, s *selection.Scratch, exact int, want ...bool) {
	t.Helper()
	if !p.Annotate(f, cands, s) {
		t.Fatal("no precise candidate")
	}
	for i, w := range want {
		if c := cands[i]; c.Precise != w || w && c.Overlap != exact {
			t.Errorf("%c: %+v, want precise %v (exact %d)", 'a'+i, c, w, exact)
		}
	}
}

// TestPreciseCapPeer checks PreciseConfig.CapPeer: under CapLoad, an exact
// overlap past the estimate's credit on this router's blocks stands only
// on a replica whose resident context is at most CapPeer times the
// candidates' mean (the in-flight counts with CapPeerInflight); a busier
// one is capped (0: DefaultCapPeer, 1.1). Off (-1), CapLoad alone decides.
// CapGain and CapFit are off here.
func TestPreciseCapPeer(t *testing.T) {
	now := time.Unix(100, 0)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // 13 tokens
	for _, tc := range []struct {
		name         string
		k            float64
		inflight     bool
		wantA, wantB bool // a idle, b three decoding requests
	}{
		{"off", -1, false, true, true},
		{"default", 0, false, true, false}, // 1.1: b holds 3 x the mean
		{"resident once", 1, false, true, false},
		{"inflight once", 1, true, true, false},
		{"resident thrice", 3.5, false, true, true}, // b holds all: 3 x its mean
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rt, cands := threeEstimated(t, PreciseConfig{Index: Config{BlockSize: 4, Now: func() time.Time { return now }},
				CapLoad: 3, CapPeer: tc.k, CapPeerInflight: tc.inflight, CapGain: -1, CapFit: -1})
			for _, c := range cands {
				rt.SetCapacity(c.Slot, 400)
			}
			ownTwoBlocks(t, p.Index(), toks)
			held := threeDecoding(rt, cands[1])
			if inf, _ := rt.Load(cands[1].Slot); inf != 3 || rt.Resident(cands[1].Slot) <= 0 || rt.Resident(cands[0].Slot) != 0 {
				t.Fatalf("setup: b in flight %d, resident %d, a resident %d; want 3, > 0, 0", inf, rt.Resident(cands[1].Slot), rt.Resident(cands[0].Slot))
			}
			f := promptOf(rt, toks)
			s := selection.NewScratch(3)
			s.Tokens = toks
			annotateWant(t, p, f, cands, s, 8, tc.wantA, tc.wantB, true)
			for _, r := range held {
				r.Release()
			}
			annotateWant(t, p, f, cands, s, 8, true, true, true) // all idle: no peer is busier
		})
	}
}

// promptOf is the features of a request for toks in blocks of 4 tokens,
// estimated at 4 bytes per token.
func promptOf(rt *selection.Router, toks []uint32) *selection.Features {
	f := rt.Extractor().NewFeatures()
	f.Blocks = selection.AppendTokenBlocks(f.Blocks[:0], 0, toks, 4)
	f.PromptBytes = len(toks) * 4
	return f
}

// coldQueued routes to c alone a cold prompt of tokens tokens (as the
// estimate counts them), a queue of pending prefill ahead of later requests
// there, and returns its reservation.
func coldQueued(rt *selection.Router, c selection.Candidate, tokens int) *selection.Reservation {
	g := rt.Extractor().NewFeatures()
	g.Blocks = selection.AppendTokenBlocks(g.Blocks[:0], 7, []uint32{90, 91, 92, 93}, 4)
	g.PromptBytes = tokens * 4
	_, r := rt.Route(g, []selection.Candidate{c}, selection.NewScratch(1), nil, nil)
	return r
}

// threeDecoding routes three short requests to c, each past its first
// token (no pending prefill, three in flight), and returns their
// reservations for the caller to release.
func threeDecoding(rt *selection.Router, c selection.Candidate) []*selection.Reservation {
	var held []*selection.Reservation
	for j := range 3 {
		g := rt.Extractor().NewFeatures()
		g.Blocks = selection.AppendTokenBlocks(g.Blocks[:0], uint64(7+j), []uint32{90, 91, 92, 93}, 4)
		g.PromptBytes = 16
		_, r := rt.Route(g, []selection.Candidate{c}, selection.NewScratch(1), nil, nil)
		r.PrefillDone()
		held = append(held, r)
	}
	return held
}

// TestPreciseCapGain checks PreciseConfig.CapGain: under CapLoad, an exact
// overlap past the estimate's credit on this router's blocks stands only
// where the replica's pending prefill exceeds the least of the other
// candidates' by less than CapGain times the tokens it credits past the
// estimate; a replica queued further than that is capped (0:
// DefaultCapGain scaled as CapGainFleet). Off (-1), CapLoad alone decides
// (CapPeer and CapFit are off here). The probes: CapGainMean (against the candidates'
// mean pending), CapGainFleet (CapGain scaled by their resident context
// over their capacity), CapPeerSlack (fewer in flight than the mean plus
// it).
func TestPreciseCapGain(t *testing.T) {
	now := time.Unix(100, 0)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // 13 tokens
	for _, tc := range []struct {
		name        string
		k, slack    float64
		mean, fleet bool
		wantB       bool // b: a 200-token prefill queued (a and c idle)
		wantRun     bool // b once that prefill has run (one in flight, none pending)
	}{
		{"off", -1, 0, false, false, true, true},
		{"default", 0, 0, false, false, false, true},        // 0.75 x 200/1200 x 8 = 1 <= 200
		{"once", 1, 0, false, false, false, true},           // b's queue (200) past 8 tokens saved
		{"large", 30, 0, false, false, true, true},          // 200 < 30 x 8
		{"twenty", 20, 0, false, false, false, true},        // 200 >= 160
		{"twenty, mean", 20, 0, true, false, true, true},    // 200 - 200/3 < 160
		{"large, fleet", 30, 0, false, true, false, true},   // 30 x 200/1200 x 8 = 40 <= 200
		{"slack half", -1, 0.5, false, false, false, false}, // b's one in flight >= 1/3 + 0.5
		{"slack one", -1, 1, false, false, true, true},      // 1 < 1/3 + 1
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rt, cands := threeEstimated(t, PreciseConfig{Index: Config{BlockSize: 4, Now: func() time.Time { return now }},
				CapLoad: 3, CapGain: tc.k, CapGainMean: tc.mean, CapGainFleet: tc.fleet, CapPeerSlack: tc.slack, CapPeer: -1, CapFit: -1})
			for _, c := range cands {
				rt.SetCapacity(c.Slot, 400)
			}
			ownTwoBlocks(t, p.Index(), toks)
			queued := coldQueued(rt, cands[1], 200)
			if _, pend := rt.Load(cands[1].Slot); pend != 200 || rt.Resident(cands[1].Slot) != 200 {
				t.Fatalf("setup: b's pending %d, resident %d, want 200 each", pend, rt.Resident(cands[1].Slot))
			}
			f := promptOf(rt, toks)
			s := selection.NewScratch(3)
			s.Tokens = toks
			annotateWant(t, p, f, cands, s, 8, true, tc.wantB, true)
			queued.PrefillDone() // b's queue runs: nothing ahead of the request
			annotateWant(t, p, f, cands, s, 8, true, tc.wantRun, true)
			queued.Release()
		})
	}
}

// TestPreciseCapFit checks PreciseConfig.CapFit and CapGainRoom, the lift
// read against the cache's size in prompts: under CapLoad, an exact overlap
// past the estimate stands only on a replica whose capacity holds CapFit x
// the 13-token prompt; with CapGainFleet, CapGainRoom scales CapGain by the
// room the capacity leaves beside the prompt ((capacity - 13) / 13, within
// 0..1). b has a 200-token prefill queued, a and c are idle. CapPeer is
// off; CapFit and CapGain -1 are off, 0 their defaults (the lift stack).
func TestPreciseCapFit(t *testing.T) {
	now := time.Unix(100, 0)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // 13 tokens
	for _, tc := range []struct {
		name         string
		capa         int64
		fit, k       float64
		room         bool
		wantA, wantB bool // a and c; b
	}{
		{"off", 400, -1, -1, false, true, true},
		{"fit 2", 400, 2, -1, false, true, true},               // 26 <= 400
		{"fit 30", 400, 30, -1, false, true, true},             // 390 <= 400
		{"fit 31", 400, 31, -1, false, false, false},           // 403 > 400
		{"fit 2, small", 20, 2, -1, false, false, false},       // 26 > 20
		{"fit 1, small", 20, 1, -1, false, true, true},         // 13 <= 20
		{"fit default", 32, 0, -1, false, false, false},        // 2.5 x 13 = 32.5 > 32: capped
		{"fit default, 36", 36, 0, -1, false, true, true},      // 32.5 <= 36
		{"stack", 400, 0, 0, false, true, false},               // 200 >= 0.75 x 200/1200 x 8 = 1
		{"stack, small", 30, 0, 0, false, false, false},        // 32.5 > 30
		{"fleet", 20, -1, 10, false, true, true},               // 200 < 10 x 200/60 x 8 = 267
		{"fleet, room", 20, -1, 10, true, true, false},         // 200 >= 267 x 7/13 = 144
		{"fleet, room, large", 400, -1, 200, true, true, true}, // room 1: 200 < 200 x 200/1200 x 8 = 267
		{"fleet, no room", 10, -1, 1000, true, false, false},   // 13 > 10: no room, capped
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rt, cands := threeEstimated(t, PreciseConfig{Index: Config{BlockSize: 4, Now: func() time.Time { return now }},
				CapLoad: 3, CapFit: tc.fit, CapGain: tc.k, CapGainFleet: tc.k > 0, CapGainRoom: tc.room, CapPeer: -1})
			for _, c := range cands {
				rt.SetCapacity(c.Slot, tc.capa)
			}
			ownTwoBlocks(t, p.Index(), toks)
			queued := coldQueued(rt, cands[1], 200)
			f := promptOf(rt, toks)
			s := selection.NewScratch(3)
			s.Tokens = toks
			annotateWant(t, p, f, cands, s, 8, tc.wantA, tc.wantB, tc.wantA)
			queued.Release()
		})
	}
}
