package selection

import (
	"math/bits"
	"slices"
)

// bandSpill is the instance-aware spill widened to a score band
// (Options.SpillBand): when the tie-breaks chose w and it is a spill (w
// holds less of the prompt than the warmest usable replica, or with
// Options.ColdSpill a cold prefix), every usable candidate scoring within
// band of the best is a spill target. The usable candidates are ranked by
// rendezvous weight; this instance (position pos) starts at rank
// floor(pos x n) of the n and takes the first target from there on,
// cyclically. Several instances that each see only their own
// reservations (and the same stale engine scrape) then walk disjoint
// stretches of one order instead of all taking the one replica that is
// best in every instance's view, the one the others have just loaded
// without its knowing.
func (rt *Router) bandSpill(cands []Candidate, s *Scratch, w int, best, band float64, first, pos uint64) int {
	e := rt.rendezvousOrder(cands, s, first)
	if len(e) < 2 {
		return w
	}
	start, _ := bits.Mul64(pos, uint64(len(e)))
	for k := range e {
		// Highest weight first: rank r is e[len-1-r].
		i := spillIndex(e[len(e)-1-(int(start)+k)%len(e)])
		if s.Score[i] >= best-band {
			return i
		}
	}
	return w
}

// rendezvousOrder packs every usable candidate's rendezvous weight for
// key first with its index (spillIndexBits low bits) into s.spill, sorted
// ascending; nil when there are more candidates than the index bits hold.
func (rt *Router) rendezvousOrder(cands []Candidate, s *Scratch, first uint64) []uint64 {
	if len(cands) > 1<<spillIndexBits {
		return nil
	}
	e := s.spill[:0]
	for i, c := range cands {
		if c.Usable {
			e = append(e, spillEntry(rt.Rendezvous(first, c.Slot), i))
		}
	}
	s.spill = e
	slices.Sort(e)
	return e
}
