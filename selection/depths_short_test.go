package selection

import (
	"math/rand/v2"
	"testing"
)

// The depth-first bisection of a short prompt over one word of slots
// (bisect1) finds what the breadth-first form finds, holes in the holder
// sets included (a replica that holds a later block of the prompt and not
// an earlier one: both forms trust the probes they make, not a walk of
// every block). The index has a slot past 63, so an interest set of two
// words (the second empty) takes the breadth-first form and one word the
// depth-first one.
func TestDepthsShortMatchesWide(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	x := NewIndex(64 << 20)
	x.Learn(blocksOf(99, 3), 70) // two words of slots
	var wk1, wk2 depthWork
	for round := range 400 {
		fam := uint64(rng.IntN(4) + 1)
		prompt := blocksOf(fam, 1+rng.IntN(shortDepths+8))
		for range 1 + rng.IntN(6) {
			s := Slot(rng.IntN(12))
			switch rng.IntN(4) {
			case 0: // a prefix
				x.Learn(prompt[:rng.IntN(len(prompt)+1)], s)
			case 1: // a stretch from the middle: holes
				i := rng.IntN(len(prompt))
				x.Learn(prompt[i:i+rng.IntN(len(prompt)-i+1)], s)
			case 2: // every other block
				for i := rng.IntN(2); i < len(prompt); i += 2 {
					x.Learn(prompt[i:i+1], s)
				}
			default:
				if rng.IntN(8) == 0 {
					x.Forget(s)
				}
			}
		}
		one := []uint64{1<<12 - 1}
		two := []uint64{1<<12 - 1, 0}
		var d1, d2 [MaxReplicas]int32
		for i := range d1 {
			d1[i], d2[i] = -1, -1
		}
		x.depths(prompt, one, d1[:], &wk1)
		x.depths(prompt, two, d2[:], &wk2)
		if d1 != d2 {
			t.Fatalf("round %d, %d blocks: depth first %v, breadth first %v", round, len(prompt), d1[:12], d2[:12])
		}
	}
}
