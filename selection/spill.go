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

// Conversation homes (SetHome): with a round-robin or random front, each
// instance's approximate index learns only the turns it routed itself, so
// a conversation's next turn dealt to another instance finds no overlap
// beyond the prefix the whole fleet holds, and goes wherever that
// instance's load says. A home is a placement every instance computes
// alike without talking: once an instance believes every usable replica
// holds the request's leading blocks (a fleet-wide prefix), the first
// block past them (the tie key, the same block for every turn of one
// conversation) picks one replica by rendezvous, and that replica scores
// as if it held the whole fingerprinted prompt. A new conversation then
// goes to its home unless load says otherwise, as does every later turn
// on every instance, so the turns meet where the first one went.
//
// The bonus is in the score only: the decision's overlap, the
// reservation's prefill and what Observe compares the engine's cached
// tokens with stay what the index believes. A prompt no replica is
// believed to hold a block of keeps the shared order (no home: a
// fleet-wide prefix is not yet known, and a hash home would pull every
// request of one prefix onto one replica), and so do exact (precise)
// candidates.

// SetHome turns conversation homes on or off for every Router that shares
// rt's state. Safe to call concurrently with Pick.
func (rt *Router) SetHome(on bool) { rt.home.Store(on) }

// Home reports whether SetHome turned conversation homes on.
func (rt *Router) Home() bool { return rt.home.Load() }

// homeBonus returns the index of the request's home among cands and the
// score it gets on top of its own capped overlap (s.Overlap as Pick
// filled it), or -1 when there is none (SetHome off, no fleet-wide prefix
// believed, the home already believed to hold the whole prompt, or an
// exact overlap).
func (rt *Router) homeBonus(f *Features, cands []Candidate, s *Scratch) (int, float64) {
	if !rt.home.Load() || len(f.Blocks) == 0 {
		return -1, 0
	}
	lo := -1
	for i := range cands {
		if cands[i].Usable && (lo < 0 || s.Overlap[i] < lo) {
			lo = s.Overlap[i]
		}
	}
	bt := rt.cfg.BlockTokens
	if lo < bt {
		return -1, 0
	}
	key := f.Blocks[min(lo/bt, len(f.Blocks)-1)]
	h, hw := -1, uint64(0)
	for i := range cands {
		if !cands[i].Usable {
			continue
		}
		if w := rt.Rendezvous(key, cands[i].Slot); h < 0 || w > hw {
			h, hw = i, w
		}
	}
	capTok := rt.cfg.AffinityCap
	full, own := min(len(f.Blocks)*bt, capTok), min(s.Overlap[h], capTok)
	if cands[h].Precise || full <= own {
		return -1, 0
	}
	return h, float64(full - own)
}
