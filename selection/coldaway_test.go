package selection

import (
	"math"
	"testing"
	"time"
)

// TestColdAway: with Options.ColdAway, a request's prefill on a replica is
// charged with the warm arrivals the replica can expect within ColdAway
// (its decayed rate of requests routed there with an overlap); a replica
// with no warm arrivals, the rule, and a prompt longer than ColdAwayMax
// pay nothing; the rate decays with warmRateTau.
func TestColdAway(t *testing.T) {
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
	var now time.Duration
	rt0.SetClock(func() time.Duration { return now })
	rt := rt0.WithOptions(Options{ColdAway: time.Second})
	// Four requests of one prefix on replica 0: the first cold, three warm.
	for range 4 {
		routeResident(t, rt, cands, 0, 1, 64).Release()
	}
	f := features(rt.Config(), blocksOf(9, 100), 0) // a cold prompt of 1,600 tokens
	s0, s := NewScratch(len(cands)), NewScratch(len(cands))
	charge := func() [2]float64 {
		rt0.Pick(f, cands, s0)
		rt.Pick(f, cands, s)
		return [2]float64{s.Load[0] - s0.Load[0], s.Load[1] - s0.Load[1]}
	}
	rate := 3 / warmRateTau.Seconds()
	got := charge()
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
	now = warmRateTau
	got = charge()
	if want := rate * 1600 / math.E; math.Abs(got[0]-want) > 0.01*want {
		t.Fatalf("after one tau: charge %v, want %.1f on replica 0", got, want)
	}
	// A warm request's own prefill is what it pays for: its 64-block hit
	// leaves 36 blocks to prefill on replica 0.
	warm := features(rt.Config(), append(blocksOf(1, 64), blocksOf(10, 36)...), 0)
	rt0.Pick(warm, cands, s0)
	rt.Pick(warm, cands, s)
	if want := rate / math.E * 36 * 16; math.Abs(s.Load[0]-s0.Load[0]-want) > 0.01*want {
		t.Fatalf("warm request: charge %.1f, want %.1f", s.Load[0]-s0.Load[0], want)
	}
}
