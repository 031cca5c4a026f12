package selection

import "strconv"

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
