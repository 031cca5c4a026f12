package selection

import (
	"testing"
	"time"
)

// With LingerGap each released context lingers on its own: until LingerGap
// times its agent's last interval between requests has passed since its
// release (the linger TTL when no earlier request was seen), and the
// agent's next request takes it back.
func TestLingerGap(t *testing.T) {
	var now time.Duration
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
	rt = rt.WithOptions(Options{PairFloor: -1, LingerGap: 2})
	rt.SetClock(func() time.Duration { return now })
	sl := cands[0].Slot
	rt.SetCapacity(sl, 16_000)
	at := func(d time.Duration) { t.Helper(); now = d }
	lingers := func(want float64) {
		t.Helper()
		// 2 x P x linger / 16,000 at P 8,000, nothing in flight.
		if got := rt.load(sl, 8000); got != want {
			t.Errorf("at %v: load %v, want %v tokens lingering", now, got, want)
		}
	}
	at(0)
	a := routeResident(t, rt, cands, 0, 1, 250) // agent A's step: 4,000 tokens
	at(time.Second)
	a.Release()
	lingers(4000)
	at(3 * time.Second)
	a = routeResident(t, rt, cands, 0, 1, 260) // A's next step, 3 s after its last: takes its context back
	if got := rt.load(sl, 8000); got != 1+2*8000*4160.0/16000 {
		t.Errorf("A's next step in flight: load %v, want only its own context", got)
	}
	at(4 * time.Second)
	a.Release()                                      // lingers 2 x 3 s
	routeResident(t, rt, cands, 0, 2, 100).Release() // agent B, no interval seen: the TTL
	lingers(4160 + 1600)
	at(10*time.Second - time.Millisecond)
	lingers(4160 + 1600)
	at(10 * time.Second)
	lingers(1600)
	at(4*time.Second + DefaultLingerTTL)
	lingers(0)
}
