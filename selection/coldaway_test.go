package selection

import (
	"math"
	"testing"
	"time"
)

// TestColdAway: with Options.ColdAway, a cold prompt (no usable replica
// holds any of it) is charged on each replica with the warm arrivals the
// replica can expect within ColdAway (its decayed rate of requests routed
// there as their sole holder); a replica with no warm arrivals, the rule,
// a warm prompt, a prompt longer than ColdAwayMax or past a sixteenth of
// the replica's KV capacity, and a fleet of SubsetGuardReplicas pay
// nothing; the rate decays with warmRateTau.
func TestColdAway(t *testing.T) {
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
	var now time.Duration
	rt0.SetClock(func() time.Duration { return now })
	rt := rt0.WithOptions(Options{ColdAway: time.Second})
	// Four requests of one prefix on replica 0 alone: the first cold, three
	// warm arrivals at their sole holder.
	for range 4 {
		routeResident(t, rt, cands, 0, 1, 64).Release()
	}
	f := features(rt.Config(), blocksOf(9, 100), 0) // a cold prompt of 1,600 tokens
	s0, s := NewScratch(len(cands)), NewScratch(len(cands))
	charge := func(f *Features) [2]float64 {
		rt0.Pick(f, cands, s0)
		rt.Pick(f, cands, s)
		return [2]float64{s.Load[0] - s0.Load[0], s.Load[1] - s0.Load[1]}
	}
	rate := 3 / warmRateTau.Seconds()
	got := charge(f)
	if want := rate * 1600; math.Abs(got[0]-want) > 0.01*want || got[1] != 0 {
		t.Fatalf("charge on replicas 0, 1 = %v, want %.1f and 0", got, want)
	}
	if d := rt.Pick(f, cands, s); d.Index != 1 {
		t.Fatalf("ColdAway: the cold prompt went to %d (loads %v), want replica 1", d.Index, s.Load)
	}
	// ColdAwayMax: a longer prompt is not charged.
	rt.WithOptions(Options{ColdAway: time.Second, ColdAwayMax: 1599}).Pick(f, cands, s)
	rt0.Pick(f, cands, s0)
	if s.Load[0] != s0.Load[0] {
		t.Fatalf("ColdAwayMax 1,599: load %.1f, want the rule's %.1f", s.Load[0], s0.Load[0])
	}
	// A prompt past a sixteenth of the replica's capacity is not charged.
	rt0.SetCapacity(cands[0].Slot, 16*1600-1)
	if got := charge(f); got[0] != 0 {
		t.Fatalf("capacity under 16 x the prompt: charge %v, want none", got)
	}
	rt0.SetCapacity(cands[0].Slot, 16*1600)
	if got := charge(f); got[0] == 0 {
		t.Fatalf("capacity 16 x the prompt: no charge, want one")
	}
	// A warm prompt (replica 0 holds 64 of its blocks) is not charged,
	// on replica 0 or on replica 1 where it is cold.
	warm := features(rt.Config(), append(blocksOf(1, 64), blocksOf(10, 36)...), 0)
	if got := charge(warm); got != [2]float64{} {
		t.Fatalf("warm prompt: charge %v, want none", got)
	}
	now = warmRateTau
	got = charge(f)
	if want := rate * 1600 / math.E; math.Abs(got[0]-want) > 0.01*want {
		t.Fatalf("after one tau: charge %v, want %.1f on replica 0", got, want)
	}
}

// TestColdAwaySoleHolder: an arrival routed to a replica that another
// usable replica holds as much of its prompt as does not count as a warm
// arrival there (it could have gone around a cold prefill); one routed to
// its sole holder does.
func TestColdAwaySoleHolder(t *testing.T) {
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
	rt0.SetClock(func() time.Duration { return 0 })
	rt := rt0.WithOptions(Options{ColdAway: time.Second})
	// Prefix 1 on both replicas, prefix 2 on replica 0 alone (each learn
	// a cold arrival: not counted).
	routeResident(t, rt, cands, 0, 1, 64).Release()
	routeResident(t, rt, cands, 1, 1, 64).Release()
	routeResident(t, rt, cands, 0, 2, 64).Release()
	s := NewScratch(len(cands))
	route := func(fam uint64) Decision {
		d, res := rt.Route(features(rt.Config(), blocksOf(fam, 64), 0), cands, s, nil, nil)
		res.Release()
		return d
	}
	for range 3 {
		if d := route(1); d.Overlap == 0 {
			t.Fatalf("prefix 1: routed cold (%+v)", d)
		}
	}
	if r0, r1 := rt.warmRate(cands[0].Slot, 0), rt.warmRate(cands[1].Slot, 0); r0 != 0 || r1 != 0 {
		t.Fatalf("arrivals held by both replicas: rates %.4f, %.4f, want 0", r0, r1)
	}
	for range 2 {
		if d := route(2); d.Index != 0 || d.Overlap == 0 {
			t.Fatalf("prefix 2: %+v, want a hit on replica 0", d)
		}
	}
	if r0, want := rt.warmRate(cands[0].Slot, 0), 2/warmRateTau.Seconds(); math.Abs(r0-want) > 0.01*want {
		t.Fatalf("arrivals at their sole holder: rate %.4f, want %.4f", r0, want)
	}
}

// TestColdAwayLargeFleet: from SubsetGuardReplicas usable replicas on,
// ColdAway charges nothing.
func TestColdAwayLargeFleet(t *testing.T) {
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16}, SubsetGuardReplicas)
	rt0.SetClock(func() time.Duration { return 0 })
	rt := rt0.WithOptions(Options{ColdAway: time.Second})
	for range 4 {
		routeResident(t, rt, cands, 0, 1, 64).Release()
	}
	f := features(rt.Config(), blocksOf(9, 100), 0)
	s0, s := NewScratch(len(cands)), NewScratch(len(cands))
	rt0.Pick(f, cands, s0)
	rt.Pick(f, cands, s)
	if s.Load[0] != s0.Load[0] {
		t.Fatalf("%d replicas: load %.1f, want the rule's %.1f", len(cands), s.Load[0], s0.Load[0])
	}
	cands[len(cands)-1].Usable = false // one fewer usable: charged
	rt0.Pick(f, cands, s0)
	rt.Pick(f, cands, s)
	if s.Load[0] == s0.Load[0] {
		t.Fatalf("%d usable replicas: no charge, want one", len(cands)-1)
	}
}
