package selection

import "slices"

// AppendCandidates appends to dst one candidate per replica of a pool, in
// pool order: slots[i] is the replica's slot (negative: not routed by the
// router), profiles[i] its profile, available(i) the proxy's own view of
// it (health, request limits). A replica is usable when it has a slot, is
// available, is not ejected by od and, with tried not nil (a retry), was
// not tried by the request already. When none is usable, the tried ones
// are offered again, and when none is admitted by od, the ejected ones
// (better a replica that may fail than certain failure).
func AppendCandidates(dst []Candidate, slots []Slot, profiles []Profile, available func(i int) bool, od *Outlier, tried *SlotSet) []Candidate {
	start := len(dst)
	dst = slices.Grow(dst, len(slots))[:start+len(slots)]
	out, profiles := dst[start:], profiles[:len(slots)] // no bounds checks below
	// The proxy's view first, in a pass of its own: the rest of the
	// checks make no call unless a replica is ejected, so that their
	// loop keeps its figures in registers; it runs only on a retry or
	// while some replica is ejected.
	usable, admitted := 0, 0
	for i, slot := range slots {
		ok := slot >= 0 && available(i)
		out[i] = Candidate{Slot: slot, Usable: ok, Profile: profiles[i]}
		if ok {
			usable++
		}
	}
	if tried == nil && od.None() {
		// No retry, none ejected: the proxy's view decides alone.
		admitted = usable
	} else {
		usable = 0
		for i := range out {
			c := &out[i]
			ok := c.Usable
			if ok && od.Ejected(c.Slot) && !od.Usable(c.Slot) { // Ejected inlined: Usable is true otherwise
				// Ejected by outlier detection: its recent answers failed.
				ok = false
			} else if ok {
				admitted++
			}
			if ok && tried != nil && tried.Has(c.Slot) {
				ok = false
			}
			if ok {
				usable++
			}
			c.Usable = ok
		}
	}
	if usable == 0 {
		for i, slot := range slots {
			ok := slot >= 0 && available(i)
			out[i].Usable = ok && (admitted == 0 || od.Usable(slot))
		}
	}
	return dst
}
