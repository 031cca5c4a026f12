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

// coldAway is Options.ColdAway's charge on placing a request whose
// prefill on s is prefill tokens: the warm arrivals s can expect within
// ColdAway (its rate times ColdAway) each wait behind that prefill.
func (rt *Router) coldAway(s Slot, prefill int, ms uint32) float64 {
	if prefill <= 0 {
		return 0
	}
	return rt.opt.ColdAway.Seconds() * rt.warmRate(s, ms) * float64(prefill)
}
