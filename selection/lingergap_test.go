package selection

import (
	"testing"
	"time"
)

// With LingerGap a released context leaves the lingering context once its
// agent is presumed ended: no next request within LingerGap times the
// agent's last interval between requests (the linger TTL when none was
// seen); the rule keeps it while anything else releases there.
func TestLingerGap(t *testing.T) {
	for _, tt := range []struct {
		name string
		opt  Options
		at10 float64 // tokens lingering 10 s in: A ended at 4 s after a 3 s interval
	}{
		{"rule", Options{PairFloor: -1}, 4160},
		{"LingerGap 2", Options{PairFloor: -1, LingerGap: 2}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var now time.Duration
			rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
			rt = rt.WithOptions(tt.opt)
			rt.SetClock(func() time.Duration { return now })
			sl := cands[0].Slot
			rt.SetCapacity(sl, 16_000)
			lingers := func(want float64) {
				t.Helper()
				// 2 x P x linger / 16,000 at P 8,000, nothing in flight.
				if got := rt.load(sl, 8000); got != want {
					t.Errorf("at %v: load %v, want %v tokens lingering", now, got, want)
				}
			}
			a := routeResident(t, rt, cands, 0, 1, 250) // agent A's step at 0: 4,000 tokens
			now = time.Second
			a.Release()
			lingers(4000)
			now = 3 * time.Second
			a = routeResident(t, rt, cands, 0, 1, 260) // A's next step, 3 s after its last, takes its context back
			if got := rt.load(sl, 8000); got != 1+2*8000*4160.0/16000 {
				t.Errorf("A's next step in flight: load %v, want only its own context", got)
			}
			now = 4 * time.Second
			a.Release() // with LingerGap 2: presumed ended 6 s on
			// Agent B (1,600 tokens) comes and goes: as any request it takes
			// its context off the linger when it comes, and adds it back.
			routeResident(t, rt, cands, 0, 2, 100).Release()
			lingers(4160)
			now = 10*time.Second - time.Millisecond
			lingers(4160)
			now = 10 * time.Second
			lingers(tt.at10)
			now = 4*time.Second + DefaultLingerTTL
			lingers(0)
		})
	}
}
