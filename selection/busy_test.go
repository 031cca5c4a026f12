package selection

import "testing"

// TestBusyGuard checks Options.HotGuard's term: request_cost once more for
// each in-flight request past HotGuard times the usable replicas' mean
// (a mean of at least one), and that it turns a warm replica's win into
// a spill to an idle one.
func TestBusyGuard(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024, AffinityCap: 1000, Alpha: 1, RequestCost: 100}
	rt, cands := newTestRouter(t, c, 4)
	c = rt.Config()
	s := NewScratch(4)
	f := features(c, blocksOf(3, 200), 0) // 3200 tokens, overlap capped at 1000
	rt.Learn(f, cands[0].Slot)
	off := rt.WithOptions(Options{HotGuard: -1})

	var rs []*Reservation
	reserve := func(i, n int) {
		for range n {
			rs = append(rs, rt.Reserve(cands[i].Slot, 0))
		}
	}
	// An idle fleet: the mean is floored at one request, so the limit is
	// 2 (DefaultHotGuard): 2 in flight pay nothing more, 3 pay once.
	reserve(0, 2)
	rt.Pick(f, cands, s)
	if s.Load[0] != 200 {
		t.Fatalf("2 in flight on an idle fleet: load %v, want 200", s.Load[0])
	}
	reserve(0, 1)
	rt.Pick(f, cands, s)
	if s.Load[0] != 400 {
		t.Fatalf("3 in flight on an idle fleet: load %v, want 300 + 100", s.Load[0])
	}
	// 9 on the warm replica, 1 on another: mean 2.5, limit 5, so
	// 9 x 100 + 4 x 100. Without the guard the warm replica still wins
	// (1000 - 900 = 100 against an idle replica's 0); with it (1000 -
	// 1300), an idle replica does.
	reserve(0, 6)
	reserve(1, 1)
	d := rt.Pick(f, cands, s)
	if s.Load[0] != 1300 || s.Load[1] != 100 {
		t.Fatalf("loads %v, want [1300 100 0 0]", s.Load)
	}
	if d.Index == 0 || d.Reason != ReasonLoadOverride {
		t.Fatalf("with the guard: %+v, want a spill off the busy warm replica", d)
	}
	if d = off.Pick(f, cands, s); d.Index != 0 || s.Load[0] != 900 || d.Score != 100 {
		t.Fatalf("without the guard: %+v loads %v, want the warm replica at load 900", d, s.Load)
	}
	// A guard of 4: limit 10, nothing added.
	if rt.WithOptions(Options{HotGuard: 4}).Pick(f, cands, s); s.Load[0] != 900 {
		t.Fatalf("HotGuard 4: load %v, want 900", s.Load[0])
	}
	// Unusable replicas do not count in the mean: with only the busy one
	// and one idle usable, mean 4.5 (9 / 2), limit 9: nothing added.
	cands[1].Usable, cands[2].Usable = false, false
	rt.Pick(f, cands, s)
	if s.Load[0] != 900 {
		t.Fatalf("two usable: load %v, want 900", s.Load[0])
	}
	for _, r := range rs {
		r.Release()
	}
}
