package selection

import (
	"math/bits"
	"slices"
)

// bandSpill is the instance-aware spill widened to a score band
// (Options.SpillBand): when the tie-breaks chose w, a spill (w holds
// less of the prompt than the warmest usable replica), every usable
// candidate scoring within band of the best is a spill target, ranked by
// rendezvous weight, and this instance (position pos) takes the one at
// its rank, as spill does among exact ties. Several instances that each
// see only their own reservations then spread a burst that spills over
// the few replicas near the best score, instead of all taking the one
// replica that is best in every instance's view (the one the others have
// just loaded without its knowing).
func (rt *Router) bandSpill(cands []Candidate, s *Scratch, w int, best, band float64, first, pos uint64) int {
	if len(cands) > 1<<spillIndexBits {
		return w
	}
	e := s.spill[:0]
	for i := range cands {
		if !cands[i].Usable || s.Score[i] < best-band {
			continue
		}
		e = append(e, rt.Rendezvous(first, cands[i].Slot)&^(1<<spillIndexBits-1)|uint64(i))
	}
	s.spill = e
	if len(e) < 2 {
		return w
	}
	slices.Sort(e)
	rank, _ := bits.Mul64(pos, uint64(len(e)))
	return int(e[len(e)-1-int(rank)] & (1<<spillIndexBits - 1))
}
