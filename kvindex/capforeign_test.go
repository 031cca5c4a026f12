package kvindex

import (
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestPreciseCapForeignQueue checks PreciseConfig.CapForeignQueue: an exact
// overlap past the estimate's credit on blocks this router did not route
// there stands, except on a replica whose pending prefill is at least
// CapForeignQueue times its KV capacity (by default 4), where it is left
// to the estimate; a replica without a queue, or whose capacity is not
// known, keeps it, and so does every replica with the gate off (-1, the
// rule before); once the queue reaches its first tokens it stands again.
func TestPreciseCapForeignQueue(t *testing.T) {
	now := time.Unix(100, 0)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // three full blocks
	for _, tc := range []struct {
		name  string
		k     float64
		queue float64 // b's and c's pending prefill in b's capacities
		wantB bool    // a: no queue, c: capacity unknown keep theirs
	}{
		{"off", -1, 4.5, true},
		{"default", 0, 4.5, false},
		{"default under", 0, 1.5, true}, // b's queue is under 4 times its capacity
		{"once", 1, 1.5, false},
		{"twice", 2, 1.5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rt, cands := threeEstimated(t, PreciseConfig{Index: Config{BlockSize: 4, Now: func() time.Time { return now }}, CapForeignQueue: tc.k})
			rt.SetCapacity(cands[0].Slot, 400)
			rt.SetCapacity(cands[1].Slot, 400)
			// Every replica holds two blocks from traffic this router did
			// not route (stored, never predicted), which its estimate does
			// not credit.
			x := p.Index()
			keys := x.Keys(nil, 0, toks)
			for i, k := range []string{"a", "b", "c"} {
				r, _ := x.Lookup(k)
				x.Apply(r, batchOf(storedEv(0, false, 4, toks[:8], uint64(11+10*i), uint64(12+10*i))))
				if x.Own(r, keys[1]) {
					t.Fatalf("%s: own, want foreign", k)
				}
			}
			// A long cold prompt queued on b and on c: pending prefill of
			// about queue times b's capacity (c's is not known).
			var queued []*selection.Reservation
			for _, c := range cands[1:] {
				queued = append(queued, coldQueued(rt, c, int(tc.queue*float64(rt.Capacity(cands[1].Slot)))))
			}
			capa := float64(rt.Capacity(cands[1].Slot))
			if _, pend := rt.Load(cands[1].Slot); float64(pend) < (tc.queue-0.5)*capa || float64(pend) >= (tc.queue+0.5)*capa || rt.Capacity(cands[2].Slot) != 0 {
				t.Fatalf("setup: b's pending %d against capacity %v; c's capacity %d (want unknown)", pend, capa, rt.Capacity(cands[2].Slot))
			}
			f := promptOf(rt, toks)
			s := selection.NewScratch(3)
			s.Tokens = toks
			annotateWant(t, p, f, cands, s, 8, true, tc.wantB, true)
			// b's queue reaches its first tokens: its exact overlap stands.
			for _, r := range queued {
				r.PrefillDone()
			}
			annotateWant(t, p, f, cands, s, 8, true, true, true)
			for _, r := range queued {
				r.Release()
			}
		})
	}
}

// TestSettingsCapForeignQueue: cap_foreign_queue reaches
// PreciseConfig.CapForeignQueue as given (0 the default, -1 off, a
// positive factor); another negative one is rejected naming the field.
func TestSettingsCapForeignQueue(t *testing.T) {
	for _, c := range []struct {
		give float64
		bad  bool
	}{{0, false}, {-1, false}, {1, false}, {2.5, false}, {-0.5, true}, {-2, true}} {
		pc, ok := validPrecise(t, Settings{CapForeignQueue: c.give}, "cap_foreign_queue", c.give, c.bad)
		if ok && pc.CapForeignQueue != c.give {
			t.Errorf("cap_foreign_queue %v: PreciseConfig.CapForeignQueue %v", c.give, pc.CapForeignQueue)
		}
	}
}
