package selection

import "sync/atomic"

// Hold keeps the reservation of one request whose end may come from
// another goroutine (its context ending) while its own goroutine reserves
// again (a retry): a reservation set after the end is released at once,
// and every reservation is released exactly once. The zero value holds
// none.
type Hold struct {
	res  atomic.Pointer[Reservation]
	done atomic.Bool
}

// Set replaces the reservation, releasing the earlier one (a retry). If
// the request already ended, the new one is released at once.
func (h *Hold) Set(res *Reservation) {
	if old := h.res.Swap(res); old != nil {
		old.Release()
	}
	if h.done.Load() {
		h.Release()
	}
}

// Release ends the current reservation, if any.
func (h *Hold) Release() {
	if r := h.res.Swap(nil); r != nil {
		r.Release()
	}
}

// PrefillDone marks the current reservation's prompt as computed.
func (h *Hold) PrefillDone() {
	if r := h.res.Load(); r != nil {
		r.PrefillDone()
	}
}

// End marks the request ended and releases its reservation; it reports
// false when the request had ended already.
func (h *Hold) End() bool {
	if !h.done.CompareAndSwap(false, true) {
		return false
	}
	h.Release()
	return true
}

// Ended reports whether End was called.
func (h *Hold) Ended() bool { return h.done.Load() }

// Current returns the reservation held now, or nil.
func (h *Hold) Current() *Reservation { return h.res.Load() }
