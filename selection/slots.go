package selection

import (
	"strconv"
	"sync/atomic"
)

// SlotSet is a set of replica slots, one bit each: the replicas an entry
// of the approximate index is believed to be on, the replicas a request
// has already tried. The zero value is empty; it is a value type (copy it
// freely) and not safe for concurrent mutation.
type SlotSet [MaxReplicas / 64]uint64

// Add puts s in the set.
func (m *SlotSet) Add(s Slot) { m[s>>6] |= 1 << (uint(s) & 63) }

// Remove takes s out of the set.
func (m *SlotSet) Remove(s Slot) { m[s>>6] &^= 1 << (uint(s) & 63) }

// Has reports whether s is in the set.
func (m *SlotSet) Has(s Slot) bool { return m[s>>6]&(1<<(uint(s)&63)) != 0 }

// Clear empties the set.
func (m *SlotSet) Clear() { *m = SlotSet{} }

// mask is the tests' name for a SlotSet.
type mask = SlotSet

// ReplicaKey names a replica as the Router registers it: its dial address,
// plus "#rank" for one data-parallel rank of an engine listed several
// times (rank < 0: the engine is listed once).
func ReplicaKey(dial string, rank int) string {
	if rank < 0 {
		return dial
	}
	return dial + "#" + strconv.Itoa(rank)
}

// Forget resets everything the detector keeps about slot s (its replica
// left the fleet; the slot's next replica starts admitted, with no failure
// history): what Unregister's callers (fleetstate.Fleet) do for the
// detector before the slot is reused.
func (o *Outlier) Forget(s Slot) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.until[s].Load() != 0
	o.until[s].Store(0)
	if out {
		o.ejected.Add(-1)
	}
	o.probing[s].Store(0)
	atomic.StoreInt32(&o.consec[s], 0)
	o.times[s] = 0
	o.back[s] = 0
	for k := range o.total[s] {
		o.total[s][k].Store(0)
	}
}
