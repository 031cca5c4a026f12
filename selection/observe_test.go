package selection

import "testing"

// Fewer cached tokens than predicted: the replica's horizon becomes the
// age at which the engine was seen to have evicted, and older beliefs go;
// more than predicted: the index trusts the engine and drops less.
func TestObserveLearnsHorizon(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	rt, cands := newTestRouter(t, c, 1)
	s0 := cands[0].Slot
	a, b := blocksOf(1, 8), blocksOf(2, 20)
	rt.Learn(&Features{Blocks: a}, s0) // a[7] touched first: clock 1 .. a[0] clock 8
	rt.Learn(&Features{Blocks: b}, s0) // clock 28
	f := features(rt.Config(), a, 0)
	var res Reservation
	d, r := rt.Route(f, cands, NewScratch(1), nil, &res)
	if d.Overlap != 8*16 {
		t.Fatalf("predicted overlap %d, want 128", d.Overlap)
	}
	// The engine held 2 of the 8 blocks: block 2 was evicted at age
	// 27 - 5 = 22 (a[7] was 27 blocks old when routed).
	if !rt.Observe(r, 0, 2*16, 0) {
		t.Fatal("a shortfall changed nothing")
	}
	if h := rt.Index().Horizon(s0); h != 22 {
		t.Fatalf("horizon %d, want 22", h)
	}
	if rt.Observe(r, 0, 2*16, 0) {
		t.Fatal("a reservation was observed twice")
	}
	// After Route's learn (clock 36), b[j] is 8+j blocks old: j >= 14 dropped.
	var interest mask
	interest.Add(s0)
	var depth [MaxReplicas]int32
	rt.Index().Depths(b, interest, &depth)
	if depth[s0] != 14 {
		t.Fatalf("b's depth %d after the horizon, want 14", depth[s0])
	}
	rt.Index().Depths(a, interest, &depth)
	if depth[s0] != 8 {
		t.Fatalf("the observed prompt itself dropped to %d (the engine just cached it)", depth[s0])
	}
	r.Release()

	// The engine reports more than the index kept: the horizon doubles.
	_, r = rt.Route(features(rt.Config(), b, 0), cands, NewScratch(1), nil, &res)
	if !rt.Observe(r, 0, 20*16, 0) || rt.Index().Horizon(s0) != 44 {
		t.Fatalf("after a surplus: horizon %d, want 44", rt.Index().Horizon(s0))
	}
	r.Release()

	// While the horizon was 22, routing b dropped a past its second
	// block; the engine still held all of a: trusted, the horizon doubles.
	_, r = rt.Route(features(rt.Config(), a, 0), cands, NewScratch(1), nil, &res)
	if r.predicted != 2 || !rt.Observe(r, 0, 8*16, 0) || rt.Index().Horizon(s0) != 88 {
		t.Fatalf("predicted %d blocks, horizon %d; want 2, 88", r.predicted, rt.Index().Horizon(s0))
	}
	r.Release()

	// Engine token counts are scaled to the index's estimated tokens: a
	// prompt the engine counts as twice as long, fully cached, confirms.
	_, r = rt.Route(features(rt.Config(), a, 0), cands, NewScratch(1), nil, &res)
	if r.predicted != 8 || rt.Observe(r, 2*8*16, 2*8*16, 0) {
		t.Fatalf("a confirmed prediction changed the index (predicted %d)", r.predicted)
	}
	r.Release()
}

// A precise decision is left to the precise index; a departed replica's
// answers are ignored.
func TestObserveIgnoresPreciseAndDeparted(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	rt, cands := newTestRouter(t, c, 2)
	a := blocksOf(3, 8)
	rt.Learn(&Features{Blocks: a}, cands[0].Slot)
	rt.Learn(&Features{Blocks: blocksOf(4, 50)}, cands[0].Slot)
	var res Reservation
	sc := NewScratch(2)
	sc.Tokens = []uint32{1}
	d, r := rt.Route(features(rt.Config(), a, 0), cands, sc, &exactAnnotator{overlap: 8 * 16}, &res)
	if d.Index != 0 || !d.Precise {
		t.Fatalf("decision %+v, want the precise candidate 0", d)
	}
	if rt.Observe(r, 0, 0, 0) {
		t.Fatal("a precise decision was corrected by Observe")
	}
	r.Release()
	_, r = rt.Route(features(rt.Config(), a, 0), cands, NewScratch(2), nil, &res)
	rt.Unregister(rt.Key(r.Slot()))
	if rt.Observe(r, 0, 0, 0) {
		t.Fatal("a departed replica's answer was observed")
	}
}
