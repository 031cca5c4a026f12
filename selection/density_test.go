package selection

import "testing"

// routeObserved routes n prompts of 64 blocks on cands and answers each
// with real prompt tokens per estimated one.
func routeObserved(t *testing.T, rt *Router, cands []Candidate, n int, realPerEst float64) {
	t.Helper()
	var res Reservation
	for i := range n {
		f := features(rt.Config(), blocksOf(uint64(100+i), 64), 0)
		_, r := rt.Route(f, cands, NewScratch(len(cands)), nil, &res)
		if r == nil {
			t.Fatal("no reservation")
		}
		est := f.PromptTokens(rt.Config())
		rt.Observe(r, int(float64(est)*realPerEst), 0, 0)
		rt.Observe(r, int(float64(est)*realPerEst), -1, 1) // the second call: counted once
		r.Release()
	}
}

func TestDensityLearnedScalesCapacity(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	for _, tc := range []struct {
		name       string
		fixed      bool
		realPerEst float64
		lo, hi     int64 // Capacity's bounds after the answers
		dlo, dhi   float64
	}{
		// 2 bytes per real token against chars_per_token 4: a replica's
		// 65,536 real tokens are about 32,768 estimated ones, but the
		// index is left to believe more (the answers' shortfalls trim
		// it); the density is learned all the same.
		{"dense", false, 2, 65_536, 65_536, 1.9, 2.2},
		// 5 bytes per token: the engine holds 81,920 estimated tokens,
		// which the index must not forget early.
		{"light", false, 0.8, 76_000, 84_000, 4.6, 5.2},
		// Exactly chars_per_token: nothing moves, not even by rounding.
		{"exact", false, 1, 65_536, 65_536, 4, 4},
		{"fixed", true, 2, 65_536, 65_536, 4, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, cands := newTestRouter(t, c, 2)
			rt = rt.WithOptions(Options{IndexShare: -1, FixedDensity: tc.fixed})
			for _, cd := range cands {
				rt.SetCapacity(cd.Slot, 65_536)
			}
			if got := rt.Capacity(cands[0].Slot); got != 65_536 {
				t.Fatalf("capacity before any answer %d, want 65536", got)
			}
			routeObserved(t, rt, cands, 200, tc.realPerEst)
			for _, cd := range cands {
				if got := rt.Capacity(cd.Slot); got < tc.lo || got > tc.hi {
					t.Errorf("slot %d capacity %d estimated tokens, want [%d, %d]", cd.Slot, got, tc.lo, tc.hi)
				}
			}
			if d := rt.Density(); d < tc.dlo || d > tc.dhi {
				t.Errorf("density %v bytes per token, want [%v, %v]", d, tc.dlo, tc.dhi)
			}
			// A capacity set after the density was learned is applied at it.
			rt.SetCapacity(cands[1].Slot, 131_072)
			if got, want := rt.Capacity(cands[1].Slot), 2*rt.Capacity(cands[0].Slot); got < want-16 || got > want+16 {
				t.Errorf("capacity set later %d, want about %d", got, want)
			}
		})
	}
}

// The first answers move the density only as far as their size warrants,
// and a nonsensical count (one token for a long prompt) is bounded.
func TestDensityPriorAndBounds(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	rt, cands := newTestRouter(t, c, 1)
	rt = rt.WithOptions(Options{IndexShare: -1})
	rt.SetCapacity(cands[0].Slot, 65_536)
	routeObserved(t, rt, cands, 1, 2)                    // 1,024 estimated tokens, 2,048 real
	if got := rt.Capacity(cands[0].Slot); got < 61_000 { // (16,384 + 1,024) / (16,384 + 2,048) of it
		t.Errorf("one answer of 512 tokens moved the capacity to %d", got)
	}
	routeObserved(t, rt, cands, 3, 1.0/1024) // one real token per prompt
	if d := rt.Density(); d > 64 {
		t.Errorf("density %v past the bound", d)
	}
}
