package selection

import (
	"math/rand/v2"
	"testing"
)

// topTwo returns the deepest and the second deepest overlap among the
// usable candidates (equal when two replicas share the deepest; -1 when
// none).
func topTwo(cands []Candidate, s *Scratch) (top1, top2 int) {
	top1, top2 = -1, -1
	for i := range cands {
		if !cands[i].Usable {
			continue
		}
		if ov := s.Overlap[i]; ov > top1 {
			top1, top2 = ov, top1
		} else if ov > top2 {
			top2 = ov
		}
	}
	return top1, top2
}

// Pick leaves in s the two deepest usable overlaps and the least (agentKey,
// the agreement and tieKey read them there instead of walking the
// candidates again): topTwo of s.Overlap as Pick left it and its minimum,
// over random fleets, overlaps and filters.
func TestPickTopTwo(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 12; n++ {
		rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 64}, n)
		s := NewScratch(n)
		for range 50 {
			prompt := blocksOf(uint64(rng.IntN(3)+1), 1+rng.IntN(40))
			for i := range cands {
				cands[i].Usable = rng.IntN(4) != 0
				if rng.IntN(2) == 0 {
					rt.Index().Learn(prompt[:rng.IntN(len(prompt)+1)], cands[i].Slot)
				}
			}
			rt.Pick(features(rt.Config(), prompt, 0), cands, s)
			top1, top2 := topTwo(cands, s)
			if s.top1 != top1 || s.top2 != top2 {
				t.Fatalf("n=%d: Pick left top two %d, %d; topTwo says %d, %d", n, s.top1, s.top2, top1, top2)
			}
			low := -1
			for i := range cands {
				if cands[i].Usable && (low < 0 || s.Overlap[i] < low) {
					low = s.Overlap[i]
				}
			}
			if s.low != low {
				t.Fatalf("n=%d: Pick left the least usable overlap %d, want %d", n, s.low, low)
			}
		}
	}
}
