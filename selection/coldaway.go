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

// warmCell is one replica's rate of warm arrivals (requests routed to it
// that it was believed to hold part of), decayed exponentially with
// warmRateTau: the rate per second as a float32 in the high 32 bits, the
// Router's clock in ms at the last update in the low 32 bits.
type warmCell struct{ v atomic.Uint64 }

// decayRate is rate r (per second) read at ms after the update stamped
// at, with time constant tau.
func decayRate(r float32, at, ms uint32, tau time.Duration) float64 {
	return float64(r) * math.Exp(-float64(ms-at)/float64(tau.Milliseconds()))
}

// warmTau is the warm-arrival rate's time constant.
func (rt *Router) warmTau() time.Duration {
	if rt.opt.ColdAwayTau > 0 {
		return rt.opt.ColdAwayTau
	}
	return warmRateTau
}

// noteWarm counts one warm arrival on s at the clock reading ms.
func (rt *Router) noteWarm(s Slot, ms uint32) {
	c := &rt.warm[s]
	for {
		w := c.v.Load()
		tau := rt.warmTau()
		r := decayRate(math.Float32frombits(uint32(w>>32)), uint32(w), ms, tau) + 1/tau.Seconds()
		nw := uint64(math.Float32bits(float32(r)))<<32 | uint64(ms)
		if c.v.CompareAndSwap(w, nw) {
			return
		}
	}
}

// warmRate is s's rate of warm arrivals per second at the clock reading ms.
func (rt *Router) warmRate(s Slot, ms uint32) float64 {
	w := rt.warm[s].v.Load()
	return decayRate(math.Float32frombits(uint32(w>>32)), uint32(w), ms, rt.warmTau())
}

// coldAway is Options.ColdAway's charge on placing a request whose
// prefill on s is prefill tokens: the warm arrivals s can expect within
// ColdAway (its rate times ColdAway) each wait behind that prefill.
func (rt *Router) coldAway(s Slot, prefill int, ms uint32) float64 {
	if prefill <= 0 {
		return 0
	}
	n := rt.opt.ColdAway.Seconds() * rt.warmRate(s, ms)
	if rt.opt.ColdAwayQuad > 0 {
		n *= float64(prefill) / rt.opt.ColdAwayQuad
	}
	if rt.opt.ColdAwayCapN > 0 {
		n = min(n, rt.opt.ColdAwayCapN)
	}
	c := n * float64(prefill)
	if rt.opt.ColdAwayCapTokens > 0 {
		c = min(c, rt.opt.ColdAwayCapTokens)
	}
	return c
}

// soleHolder reports whether candidate w (as Pick left s) holds more of
// the prompt than every other usable candidate.
func (rt *Router) soleHolder(cands []Candidate, s *Scratch, w int) bool {
	for i := range cands {
		if i != w && cands[i].Usable && s.Overlap[i] >= s.Overlap[w] {
			return false
		}
	}
	return true
}
