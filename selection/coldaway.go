package selection

import (
	"math"
	"sync/atomic"
	"time"
)

// warmRateTau is the time constant of a replica's rate of warm arrivals
// (Options.ColdAway): long enough that a replica homing a few dozen
// groups each seen every few minutes has a measurable rate.
const warmRateTau = 30 * time.Second

// coldAwayKVShare: ColdAway charges a replica only for a prompt of at
// most 1/coldAwayKVShare of its KV capacity. A larger cold prefill evicts
// much of what the replica's warm arrivals would hit (at 65,536 tokens a
// 7.3k prompt is a ninth of the cache), so there is little warm traffic
// to keep it from.
const coldAwayKVShare = 16

// warmCell is one replica's rate of warm arrivals (requests routed to it
// as the sole replica believed to hold most of their prompt), decayed
// exponentially with warmRateTau: the rate per second as a float32 in the
// high 32 bits, the Router's clock in ms at the last update in the low 32
// bits.
type warmCell struct{ v atomic.Uint64 }

// decay is rate r (per second) read at ms after the update stamped at.
func decayRate(r float32, at, ms uint32) float64 {
	return float64(r) * math.Exp(-float64(ms-at)/float64(warmRateTau.Milliseconds()))
}

// noteWarm counts one warm arrival on s at the clock reading ms.
func (rt *Router) noteWarm(s Slot, ms uint32) {
	c := &rt.warm[s]
	for {
		w := c.v.Load()
		r := decayRate(math.Float32frombits(uint32(w>>32)), uint32(w), ms) + 1/warmRateTau.Seconds()
		nw := uint64(math.Float32bits(float32(r)))<<32 | uint64(ms)
		if c.v.CompareAndSwap(w, nw) {
			return
		}
	}
}

// warmRate is s's rate of warm arrivals per second at the clock reading ms.
func (rt *Router) warmRate(s Slot, ms uint32) float64 {
	w := rt.warm[s].v.Load()
	return decayRate(math.Float32frombits(uint32(w>>32)), uint32(w), ms)
}

// coldAway is Options.ColdAway's charge on placing a cold prompt of
// prompt tokens on s: the warm arrivals s can expect within ColdAway (its
// rate times ColdAway) each wait behind its prefill. None when the prompt
// is past 1/coldAwayKVShare of s's KV capacity.
func (rt *Router) coldAway(s Slot, prompt int, ms uint32) float64 {
	if prompt <= 0 || int64(prompt)*coldAwayKVShare > rt.loads[s].kv() {
		return 0
	}
	return rt.opt.ColdAway.Seconds() * rt.warmRate(s, ms) * float64(prompt)
}

// soleHolder reports whether candidate w (overlaps as Pick left them in
// s) holds more of the prompt than every other usable candidate: an
// arrival with nowhere else as warm to go, which a cold prefill on w
// would hold up (Options.ColdAway counts only these). An arrival that
// other replicas hold as well can be routed around the prefill by the
// load term.
func soleHolder(cands []Candidate, s *Scratch, w int) bool {
	for i := range cands {
		if i != w && cands[i].Usable && s.Overlap[i] >= s.Overlap[w] {
			return false
		}
	}
	return true
}
