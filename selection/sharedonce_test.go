package selection

import "testing"

// Requests of different sessions that share a deep prefix (not at any of
// the four depths reserveChain's rule compares: half of every prompt is
// deeper) count it once in the context the overflow term charges under
// SharedOnce, as the engine holds it: the later one counts the shared
// blocks, each earlier one gives them up once (a third sharer takes
// nothing more from the first). The pair term's resident context is
// the rule's either way. Released in any order, nothing stays.
func TestSharedOnceCountsSharedPrefixOnce(t *testing.T) {
	const bt = 16
	for _, tt := range []struct {
		name   string
		opt    Options
		wantKV int64
	}{
		{"rule before", Options{}, 0},
		{"shared once", Options{SharedOnce: true}, (130 + 110 + 300) * bt},
	} {
		rt, cands := newTestRouter(t, Config{BlockTokens: bt}, 2)
		rt = rt.WithOptions(tt.opt)
		s0, s1 := cands[0].Slot, cands[1].Slot
		a := routeTo(t, rt, cands, 0, tokensOf(1, 7, 100, 230))
		b := routeTo(t, rt, cands, 0, tokensOf(1, 8, 100, 210))
		c := routeTo(t, rt, cands, 0, tokensOf(1, 9, 100, 300))
		o := routeTo(t, rt, cands, 1, tokensOf(1, 6, 100, 120)) // elsewhere: its own
		if got, want := rt.Resident(s0), int64((230+210+300)*bt); got != want {
			t.Errorf("%s: resident %d, want %d", tt.name, got, want)
		}
		if got := rt.chains[s0].kv.Load(); got != tt.wantKV {
			t.Errorf("%s: KV context %d, want %d", tt.name, got, tt.wantKV)
		}
		if got, want := rt.chains[s1].kv.Load(), int64(120*bt); tt.opt.SharedOnce && got != want {
			t.Errorf("%s: the other replica's KV context %d, want %d", tt.name, got, want)
		}
		c.Release()
		o.Release()
		a.Release()
		b.Release()
		if rt.Resident(s0) != 0 || rt.chains[s0].kv.Load() != 0 || rt.chains[s1].kv.Load() != 0 {
			t.Errorf("%s: resident %d, KV context %d / %d after every release", tt.name,
				rt.Resident(s0), rt.chains[s0].kv.Load(), rt.chains[s1].kv.Load())
		}
	}
}

// The overflow term charges what the replica's in-flight requests hold
// past its KV capacity; under SharedOnce a prefix they share counts once
// there, so a replica running three requests of one framework's 3,200-token
// prompt is not charged as if it held three copies.
func TestSharedOnceOverflow(t *testing.T) {
	const bt = 16
	load := func(opt Options) float64 {
		rt, cands := newTestRouter(t, Config{BlockTokens: bt}, 1)
		rt = rt.WithOptions(opt)
		rt.SetCapacity(cands[0].Slot, 16_000)
		for i := range 3 {
			routeTo(t, rt, cands, 0, tokensOf(1, uint64(7+i), 200, 450)) // 7,200 tokens, 3,200 shared
		}
		return rt.load(cands[0].Slot, 1_000)
	}
	before, once := load(Options{}), load(Options{SharedOnce: true})
	// Own context 21,600 tokens (+1,000) against 16,000: overflow 6,600
	// x 4; counted once 15,200 (+1,000): 200 x 4.
	if want := 4.0 * (6_600 - 200); before-once != want {
		t.Errorf("load %.0f before, %.0f shared once: differ by %.0f, want %.0f", before, once, before-once, want)
	}
}

// sharedDepth finds the deepest common prefix of two chains.
func TestSharedDepth(t *testing.T) {
	for _, tt := range []struct {
		a, b []uint64
		want int32
	}{
		{nil, nil, 0},
		{tokensOf(1, 7, 100, 230), tokensOf(1, 8, 100, 170), 100},
		{tokensOf(1, 7, 0, 10), tokensOf(1, 8, 0, 10), 0},
		{tokensOf(1, 7, 100, 100), tokensOf(1, 7, 100, 100), 100},
		{tokensOf(1, 7, 1, 50), tokensOf(1, 8, 1, 60), 1},
		{tokensOf(1, 7, 49, 50), tokensOf(1, 8, 49, 49), 49},
	} {
		if got := sharedDepth(tt.a, tt.b); got != tt.want {
			t.Errorf("sharedDepth(%d blocks, %d blocks) = %d, want %d", len(tt.a), len(tt.b), got, tt.want)
		}
	}
}

// Route under SharedOnce allocates nothing once the reservations have
// held a prompt of that size.
func TestSharedOnceRouteAllocs(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 4)
	rt = rt.WithOptions(Options{SharedOnce: true})
	s := NewScratch(len(cands))
	f := features(rt.Config(), tokensOf(1, 7, 100, 230), 0)
	g := features(rt.Config(), tokensOf(1, 8, 100, 170), 0)
	twoRoutesAllocFree(t, rt, cands, s, f, g)
}

// The gated form (OnceBelow) counts a shared prefix once where the
// replica's KV capacity is below OnceBelow times the mean prompt
// reserved lately, and as the rule does where it is above: the same
// three 7,200-token prompts charge the once load under 16,000 tokens of
// KV (3 x 7,200 = 21,600 above it) and the rule's load under 22,000.
func TestOnceBelowGate(t *testing.T) {
	const bt = 16
	load := func(opt Options, capa int64) (float64, *Router) {
		rt, cands := newTestRouter(t, Config{BlockTokens: bt}, 1)
		rt = rt.WithOptions(opt)
		rt.SetCapacity(cands[0].Slot, capa)
		for i := range 3 {
			routeTo(t, rt, cands, 0, tokensOf(1, uint64(7+i), 200, 450)) // 7,200 tokens, 3,200 shared
		}
		return rt.load(cands[0].Slot, 1_000), rt
	}
	for _, capa := range []int64{16_000, 22_000} {
		rule, _ := load(Options{}, capa)
		once, _ := load(Options{SharedOnce: true}, capa)
		gated, rt := load(Options{OnceBelow: 3}, capa)
		if got := rt.promptAvg.Load() / promptAvgScale; got != 7_200 {
			t.Errorf("capacity %d: mean prompt %d, want 7,200", capa, got)
		}
		want, name := rule, "the rule's"
		if capa < 3*7_200 {
			want, name = once, "SharedOnce's"
		}
		if gated != want || rule == once {
			t.Errorf("capacity %d: gated load %.0f, want %s %.0f (rule %.0f, once %.0f)", capa, gated, name, want, rule, once)
		}
	}

	// Both counts are kept whatever the gate says: shut (a large KV),
	// the chain list already counts the shared 3,200 tokens once, and the
	// gate opening reads it, as SharedOnce would.
	var rs []*Reservation
	var loads [2]float64
	for k, opt := range []Options{{OnceBelow: 3}, {SharedOnce: true}} {
		rt, cands := newTestRouter(t, Config{BlockTokens: bt}, 1)
		rt = rt.WithOptions(opt)
		s0 := cands[0].Slot
		rt.SetCapacity(s0, 1_000_000)
		for i := range 3 {
			rs = append(rs, routeTo(t, rt, cands, 0, tokensOf(1, uint64(7+i), 200, 450)))
		}
		if got, want := rt.chains[s0].kv.Load(), int64(4_000+4_000+7_200); got != want {
			t.Errorf("%+v: KV context %d, want %d", opt, got, want)
		}
		rt.SetCapacity(s0, 16_000)
		loads[k] = rt.load(s0, 1_000)
	}
	if loads[0] != loads[1] {
		t.Errorf("gate opened: load %.0f, SharedOnce's %.0f", loads[0], loads[1])
	}
	for _, r := range rs {
		r.Release()
	}
	if got := rs[0].rt.chains[rs[0].Slot()].kv.Load(); got != 0 {
		t.Errorf("KV context %d after every release", got)
	}
}
