package selection

import (
	"math/bits"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Instance-aware spill: several ramjet instances in front of one fleet,
// with no traffic between them, agree on where a cold prefix goes (the
// rendezvous order of its tie key is the same on every instance, by
// design). When the replicas holding a prefix are too loaded and the
// request spills to a less warm one, every instance would also walk the
// same rendezvous order, each seeing only its own reservations, so a
// burst split over N instances piles N-deep onto the same few replicas.
//
// An instance position u in [0, 1) (SetInstance) breaks that symmetry
// for spills only: among the tied spill candidates, ranked by the shared
// rendezvous order, the instance takes the one at rank floor(u x m) of m
// instead of the first. A cold prefix (no replica holds any of it) and a
// tie among equally warm replicas still follow the shared order, so the
// instances keep agreeing on the first choice. Position 0 is the shared
// order everywhere (a lone instance, or one that sets none).

// InstancePosition is the spill position of the instance named id, as a
// fraction of 2^64. An id ending in a decimal ordinal (the whole id, or
// digits after '-', '_' or '.': a StatefulSet pod "ramjet-2", "3") takes
// the ordinal's golden-ratio point, frac(n x 0.618...), so that instances
// 0..N-1 spill to positions spread as evenly as a sequence can (0, 0.618,
// 0.236, 0.854, ...); any other id takes its hash (positions at random).
// The empty id is position 0.
func InstancePosition(id string) uint64 {
	if id == "" {
		return 0
	}
	i := len(id)
	for i > 0 && id[i-1] >= '0' && id[i-1] <= '9' {
		i--
	}
	if i < len(id) && (i == 0 || id[i-1] == '-' || id[i-1] == '_' || id[i-1] == '.') {
		if n, err := strconv.ParseUint(id[i:], 10, 64); err == nil {
			return n * 0x9E3779B97F4A7C15 // 2^64 / golden ratio
		}
	}
	return xxhash.Sum64String(id)
}

// SetInstance sets this instance's spill position (InstancePosition of
// its id): every Router that shares rt's state (Retune, WithOptions)
// applies it. Safe to call concurrently with Pick.
func (rt *Router) SetInstance(id string) { rt.spread.Store(InstancePosition(id)) }

// Instance returns the spill position SetInstance set (0: the shared
// order).
func (rt *Router) Instance() uint64 { return rt.spread.Load() }

// spillIndexBits is how many low bits of a packed spill entry hold the
// candidate's index (the rest is its rendezvous weight).
const spillIndexBits = 11

// spillEntry packs rendezvous weight w with candidate index i (its low
// spillIndexBits bits), so that sorting entries sorts by weight.
func spillEntry(w uint64, i int) uint64 { return w&^(1<<spillIndexBits-1) | uint64(i) }

// spillIndex is the candidate index of a packed rendezvous entry.
func spillIndex(e uint64) int { return int(e & (1<<spillIndexBits - 1)) }

// spill returns the candidate this instance takes when the tie-breaks
// chose w among tied candidates none of which is the warmest usable one
// (a spill, see SetInstance): among the candidates tied with w down to
// the rendezvous rule (same overlap, same profile when it matters),
// ranked by rendezvous weight, the one at this instance's position.
func (rt *Router) spill(cands []Candidate, s *Scratch, w int, best float64, wantSet bool, first, pos uint64) int {
	if len(cands) > 1<<spillIndexBits {
		return w
	}
	e := s.spill[:0]
	for i := range cands {
		if !cands[i].Usable || s.Score[i] < best-rt.cfg.TieEpsilon || s.Overlap[i] != s.Overlap[w] ||
			(wantSet && cands[i].Profile != cands[w].Profile) {
			continue
		}
		e = append(e, spillEntry(rt.Rendezvous(first, cands[i].Slot), i))
	}
	s.spill = e
	if len(e) < 2 {
		return w
	}
	slices.Sort(e)
	rank, _ := bits.Mul64(pos, uint64(len(e)))
	return spillIndex(e[len(e)-1-int(rank)])
}
