package selection

import "testing"

// routeResident routes a prompt of n blocks of family fam to the only
// usable candidate i, so that its tokens stay resident there until res is
// released.
func routeResident(t *testing.T, rt *Router, cands []Candidate, i int, fam uint64, n int) *Reservation {
	t.Helper()
	only := make([]Candidate, len(cands))
	copy(only, cands)
	for k := range only {
		only[k].Usable = k == i
	}
	d, res := rt.Route(features(rt.Config(), blocksOf(fam, n), 0), only, NewScratch(len(only)), nil, nil)
	if d.Index != i || res == nil {
		t.Fatalf("routing to candidate %d: %+v", i, d)
	}
	res.PrefillDone()
	return res
}

func TestPairWeightLoad(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
	sl := cands[0].Slot
	rt.SetCapacity(sl, 16_000)
	res := routeResident(t, rt, cands, 0, 1, 250) // 4,000 tokens resident
	defer res.Release()
	// request_cost + 2 x P x 4,000 / 16,000
	for _, tt := range []struct {
		prompt int
		want   float64
	}{{0, 1}, {100, 1 + 50}, {8000, 1 + 4000}} {
		if got := rt.load(sl, tt.prompt); got != tt.want {
			t.Errorf("load for a %d-token prompt = %v, want %v", tt.prompt, got, tt.want)
		}
	}
}

func TestOverflowWeightLoad(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, OverflowWeight: 3}, 2)
	sl := cands[0].Slot
	rt.SetCapacity(sl, 10_000)
	res := routeResident(t, rt, cands, 0, 1, 500) // 8,000 tokens resident
	// Below the capacity nothing is added; past it, 3 per missing token.
	if got := rt.load(sl, 2000); got != 1 {
		t.Errorf("load for a prompt that fits = %v, want 1", got)
	}
	if got := rt.load(sl, 2500); got != 1+3*500 {
		t.Errorf("load for a prompt 500 tokens past the capacity = %v, want %v", got, 1+3*500)
	}
	// Engine-reported KV of others counts as resident.
	rt.SetExternalLoad(sl, 0, 0, 1000)
	if got := rt.load(sl, 2000); got != 1+3*1000 {
		t.Errorf("load with 1,000 external KV tokens = %v, want %v", got, 1+3*1000)
	}
	rt.SetExternalLoad(sl, 0, 0, 0)
	res.Release()
	if got := rt.load(sl, 9000); got != 0 {
		t.Errorf("load after release = %v, want 0", got)
	}
}

// A long-context request leaves a replica whose running requests are long
// too, for one that holds less of its prompt; a short request sharing the
// same warm prefix stays: the pair term weighs request by request.
func TestPairWeightSpreadsLongContexts(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 4}, 2)
	for _, c := range cands {
		rt.SetCapacity(c.Slot, 256_000)
	}
	shared := blocksOf(7, 1250) // a 20,000-token shared prefix
	rt.Learn(&Features{Blocks: shared}, cands[0].Slot)
	var held []*Reservation
	for fam := uint64(10); fam < 13; fam++ {
		held = append(held, routeResident(t, rt, cands, 0, fam, 1000)) // 3 x 16,000 tokens
	}
	defer func() {
		for _, r := range held {
			r.Release()
		}
	}()
	s := NewScratch(2)

	long := append(append([]uint64(nil), shared...), blocksOf(20, 2500)...) // 60,000 tokens
	d := rt.Pick(features(rt.Config(), long, 0), cands, s)
	if d.Index != 1 {
		t.Fatalf("long request: %+v (loads %v), want the idle replica", d, s.Load)
	}
	// 60,000 x 4 x 48,000 / 256,000 = 45,000 of load against 20,000 of
	// overlap; a 992-token prompt, all of it warm, weighs 744 + 3.
	small := shared[:62]
	if d := rt.Pick(features(rt.Config(), small, 0), cands, s); d.Index != 0 {
		t.Fatalf("small request: %+v (loads %v), want the warm replica", d, s.Load)
	}
}
