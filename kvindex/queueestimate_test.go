package kvindex

import (
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestPreciseQueueEstimate checks PreciseConfig.QueueEstimate: an exact
// overlap below the estimate's credit decides on a replica without a
// queue, and is left to the estimate on a replica whose pending prefill is
// at least QueueEstimate times its KV capacity (by default once), never
// where the capacity is not known, and always with the rule off.
func TestPreciseQueueEstimate(t *testing.T) {
	now := time.Unix(100, 0)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12} // three full blocks
	for _, tc := range []struct {
		name string
		k    float64
		// want: whether a (queued past the bound), b (no queue) and c
		// (queued, capacity unknown) keep their exact overlap.
		wantA, wantB, wantC bool
	}{
		{"default", 0, false, true, true},
		{"off", -1, true, true, true},
		{"twice", 2, true, true, true}, // a's queue is under twice its capacity
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rt, cands := threeEstimated(t, PreciseConfig{Index: Config{BlockSize: 4, Now: func() time.Time { return now }}, QueueEstimate: tc.k})
			const capa = 400 // tokens: 100 router blocks, room for the prompt
			rt.SetCapacity(cands[0].Slot, capa)
			rt.SetCapacity(cands[1].Slot, capa)
			x := p.Index()
			f := promptOf(rt, toks)
			// The estimate credits every replica with the whole prompt; the
			// engines kept its first block only (they evicted the rest).
			for i, k := range []string{"a", "b", "c"} {
				rt.Learn(f, cands[i].Slot)
				r, _ := x.Lookup(k)
				x.Apply(r, batchOf(storedEv(0, false, 4, toks[:4], uint64(11+10*i))))
			}
			// A long cold prompt queued on a and on c: its pending prefill
			// (about 1.5 times a's capacity as the index applies it) is
			// ahead of the request.
			s := selection.NewScratch(3)
			var queued []*selection.Reservation
			for _, i := range []int{0, 2} {
				queued = append(queued, coldQueued(rt, cands[i], int(1.5*float64(rt.Capacity(cands[0].Slot)))))
			}
			if _, pend := rt.Load(cands[0].Slot); float64(pend) < float64(rt.Capacity(cands[0].Slot)) || rt.Capacity(cands[2].Slot) != 0 {
				t.Fatalf("setup: a's pending %d against capacity %d; c's capacity %d (want unknown)", pend, rt.Capacity(cands[0].Slot), rt.Capacity(cands[2].Slot))
			}
			s.Tokens = toks
			annotateWant(t, p, f, cands, s, 4, tc.wantA, tc.wantB, tc.wantC)
			d := rt.Pick(f, cands, s)
			wantA := 4
			if !tc.wantA {
				wantA = 12 // the estimate's credit
			}
			if s.Overlap[0] != wantA || s.Overlap[1] != 4 {
				t.Errorf("Pick's overlaps %v, want a %d, b 4 (decision %+v)", s.Overlap[:3], wantA, d)
			}

			// The queue ahead reaches its first tokens: the exact overlap
			// decides again.
			for _, res := range queued {
				res.PrefillDone()
			}
			p.Annotate(f, cands, s)
			if !cands[0].Precise || cands[0].Overlap != 4 {
				t.Errorf("a without a queue: %+v, want the exact 4", cands[0])
			}
			for _, res := range queued {
				res.Release()
			}
		})
	}
}
