package selection

import "testing"

// TestAgentMove: with Options.AgentMove, the smallest agent in flight on a
// home whose in-flight contexts and the request's new tokens pass the bound
// leaves for a replica with room; a larger agent stays, and so does the
// small one when no replica has room or the home is under the bound.
func TestAgentMove(t *testing.T) {
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
	for _, c := range cands {
		rt0.SetCapacity(c.Slot, 200_000)
	}
	rt := rt0.WithOptions(Options{AgentMove: 0.6})
	s := NewScratch(len(cands))
	big := routeResident(t, rt, cands, 0, 1, 4375)   // 70,000 tokens
	small := routeResident(t, rt, cands, 0, 2, 3125) // 50,000 tokens
	defer small.Release()
	step := func(fam uint64, n int) *Features { // the agent's next step: 8,000 new tokens
		return features(rt.Config(), append(blocksOf(fam, n), blocksOf(fam+100, 500)...), 0)
	}
	// 120,000 in flight + 8,000 new > 0.6 x 200,000; replica 1 empty. The
	// home then pays 12 x 58,000 x 120,000 / 200,000 against 50,000 of
	// overlap.
	if d := rt0.Pick(step(2, 3125), cands, s); d.Index != 0 || d.Overlap != 50_000 {
		t.Fatalf("rule: %+v, want the home", d)
	}
	if d := rt.Pick(step(2, 3125), cands, s); d.Index != 1 {
		t.Fatalf("AgentMove, the smallest agent: %+v (loads %v), want replica 1", d, s.Load)
	}
	if d := rt.Pick(step(1, 4375), cands, s); d.Index != 0 {
		t.Fatalf("AgentMove, the larger agent: %+v (loads %v), want the home", d, s.Load)
	}
	// Replica 1 runs 60,000: 118,000 with the prompt, past 0.5 x 200,000.
	other := routeResident(t, rt, cands, 1, 3, 3750)
	if d := rt.Pick(step(2, 3125), cands, s); d.Index != 0 {
		t.Fatalf("AgentMove, no room elsewhere: %+v, want the home", d)
	}
	if d := rt.WithOptions(Options{AgentMove: 0.6, AgentMoveRoom: 0.6}).Pick(step(2, 3125), cands, s); d.Index != 1 {
		t.Fatalf("AgentMoveRoom 0.6: %+v, want replica 1", d)
	}
	other.Release()
	// The large agent done: 50,000 + 8,000 under the bound.
	big.Release()
	if d := rt.Pick(step(2, 3125), cands, s); d.Index != 0 {
		t.Fatalf("AgentMove, home under the bound: %+v, want the home", d)
	}
}
