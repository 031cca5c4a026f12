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

// The engine caches a reply's blocks beside its prompt's (vLLM caches a
// sequence's generated full blocks, SGLang inserts input and output ids):
// with Options.ReplyCharge, Observe's completion tokens take room in the
// replica's modelled cache, so older prompts are presumed evicted as the
// engine evicts them. When the next turn extends the prompt on that
// replica and the engine reports that it reused the reply, the next
// turn's own blocks cover the reply, which stops counting twice.
func TestObserveChargesReply(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	tests := []struct {
		name      string
		opt       Options
		wantHeld  int64 // after a's answer
		wantDepth int32 // the older prompt z's depth then
	}{
		// 8 blocks of z, 8 of a, 6 of a's reply past the capacity of 20:
		// z's last 2 presumed evicted.
		{"charged", Options{ReplyCharge: true}, 20, 6},
		{"off", Options{}, 16, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, cands := newTestRouter(t, c, 1)
			rt := base.WithOptions(tt.opt)
			s0 := cands[0].Slot
			rt.SetCapacity(s0, 20*16)
			z, a := blocksOf(1, 8), blocksOf(2, 8)
			rt.Learn(&Features{Blocks: z}, s0)
			var res Reservation
			_, r := rt.Route(features(rt.Config(), a, 0), cands, NewScratch(1), nil, &res)
			// The engine counts 256 prompt tokens where the index
			// estimated 128: its 192 completion tokens are 96 of the
			// index's, 6 blocks.
			rt.Observe(r, 256, 8*16, 0)
			rt.Observe(r, 256, -1, 192)
			rt.Observe(r, 256, -1, 192) // charged once
			r.Release()
			if got := rt.Index().Held(s0); got != tt.wantHeld {
				t.Fatalf("holds %d blocks after a's answer, want %d", got, tt.wantHeld)
			}
			if d := depthOn(rt.Index(), z, s0); d != tt.wantDepth {
				t.Fatalf("z's depth %d after a's answer, want %d", d, tt.wantDepth)
			}
			// The reply's blocks are the first of a's the engine evicts
			// (it releases a sequence's blocks deepest first): a third
			// prompt takes the rest of z, then the reply, then a.
			rt.Learn(&Features{Blocks: blocksOf(4, 8+int(tt.wantHeld-16))}, s0)
			if d := depthOn(rt.Index(), a, s0); d != 8 {
				t.Fatalf("a's depth %d, want 8: its reply goes first", d)
			}
		})
	}

	// The next turn extends turn 1's prompt on the replica. An engine that
	// reused the reply reports more cached than the index predicted (the
	// reply's blocks): the charge goes, turn 2's own blocks cover it. One
	// that did not (a reply the next prompt does not render as generated)
	// still holds both.
	for _, tt := range []struct {
		name     string
		cached   int
		wantHeld int64
	}{
		{"reused", 14 * 16, 14},
		{"not reused", 8 * 16, 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base, cands := newTestRouter(t, c, 1)
			rt := base.WithOptions(Options{ReplyCharge: true})
			s0 := cands[0].Slot
			turn1, turn2 := blocksOf(3, 8), blocksOf(3, 14)
			var res Reservation
			_, r := rt.Route(features(rt.Config(), turn1, 0), cands, NewScratch(1), nil, &res)
			rt.Observe(r, 0, -1, 6*16)
			r.Release()
			if got := rt.Index().Held(s0); got != 14 {
				t.Fatalf("holds %d blocks after turn 1's answer, want 14", got)
			}
			_, r = rt.Route(features(rt.Config(), turn2, 0), cands, NewScratch(1), nil, &res)
			if r.predicted != 8 {
				t.Fatalf("turn 2 predicted %d blocks, want 8", r.predicted)
			}
			rt.Observe(r, 0, tt.cached, 0)
			if got := rt.Index().Held(s0); got != tt.wantHeld {
				t.Fatalf("holds %d blocks after turn 2's answer, want %d", got, tt.wantHeld)
			}
		})
	}
}

// A shortfall's horizon does not drop what was routed to the replica
// since the oldest request still in flight there (Options.InflightGuard):
// the engine holds those requests' prompts, or is about to, in an order
// of its own (its LRU ranks a prompt by its request's end, not by when
// ramjet routed it).
func TestObserveInflightGuard(t *testing.T) {
	tests := []struct {
		name           string
		give           Options
		horizon, depth int64
	}{
		{"off", Options{}, 22, 14},
		// b, in flight since clock 28 with 20 blocks, is 29 touches deep.
		{"guard", Options{InflightGuard: true}, 29, 20},
		{"floor", Options{HorizonFloor: 1}, 40, 20},
		// The guard capped at 20 blocks: the shortfall's own age is more.
		{"guard under floor", Options{InflightGuard: true, HorizonFloor: 0.5}, 22, 14},
		// GuardCap: the guard keeps 29 touches; it applies while that is
		// at most GuardCap times the capacity of 40 blocks.
		{"guard within its cap", Options{InflightGuard: true, GuardCap: 1}, 29, 20},
		{"guard past its cap", Options{InflightGuard: true, GuardCap: 0.5}, 22, 14},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
			rt, cands := newTestRouter(t, c, 1)
			rt = rt.WithOptions(tt.give)
			s0 := cands[0].Slot
			rt.SetCapacity(s0, 40*16)
			a, b := blocksOf(1, 8), blocksOf(2, 20)
			rt.Learn(&Features{Blocks: a}, s0) // clock 8
			var resA, resB Reservation
			sc := NewScratch(1)
			_, rb := rt.Route(features(rt.Config(), b, 0), cands, sc, nil, &resB) // in flight; clock 28
			_, ra := rt.Route(features(rt.Config(), a, 0), cands, sc, nil, &resA) // clock 36
			if ra.predicted != 8 {
				t.Fatalf("predicted %d blocks, want 8", ra.predicted)
			}
			// The engine held 2 of a's 8 blocks: evicted at age 22.
			if !rt.Observe(ra, 0, 2*16, 0) {
				t.Fatal("a shortfall changed nothing")
			}
			if h := rt.Index().Horizon(s0); h != tt.horizon {
				t.Errorf("horizon %d, want %d", h, tt.horizon)
			}
			if d := depthOn(rt.Index(), b, s0); int64(d) != tt.depth {
				t.Errorf("b's depth %d, want %d", d, tt.depth)
			}
			ra.Release()
			rb.Release()
		})
	}
}

// depthOn is how many leading blocks of blocks slot s is believed to hold.
func depthOn(x *Index, blocks []uint64, s Slot) int32 {
	var interest mask
	interest.Add(s)
	var depth [MaxReplicas]int32
	x.Depths(blocks, interest, &depth)
	return depth[s]
}
