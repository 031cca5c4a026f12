package kvindex

// ownMem remembers (replica, router key) pairs this router sent to a
// replica whose ownRef mark the index could not keep: an own block the
// engine evicted (BlockRemoved, a fence), a prediction dropped before its
// BlockStored arrived (Config.MaxPredicted reached, or its ttl passed while
// its request was still held). When the engine stores such a key again, the
// mark comes back (Own), so the estimate cap (Precise.SetEstimate) still
// tells this router's blocks from other routers' and clients'.
//
// Without it, on a fleet whose contexts outgrow the KV cache, a
// conversation's blocks lost the mark the first time the engine evicted
// them while a request for them queued and then recomputed them (that
// request's prediction was not made: the blocks were held at its
// decision), or when more blocks were in flight than MaxPredicted: the
// exact overlap then kept the conversation on its replica past what the
// estimate trusts (bench/EXPERIMENTS.md, precise7).
//
// Bounded by Config.MaxOwnGone pairs, oldest out first; guarded by
// Index.mu.
type ownMem struct {
	at   map[predID]uint64 // pair -> stamp of its ring slot
	ring []predID          // grows to max, then wraps
	max  int
	next uint64 // stamps issued; the ring slot of stamp s is (s-1) % max
}

func (m *ownMem) init(max int) {
	m.at = make(map[predID]uint64)
	m.max = max
}

// add remembers id, dropping the oldest pair when full.
func (m *ownMem) add(id predID) {
	if m.max <= 0 {
		return
	}
	if _, ok := m.at[id]; ok {
		return // its slot stays; it leaves a little early
	}
	n := uint64(m.max)
	m.next++
	if len(m.ring) < m.max {
		m.ring = append(m.ring, id)
	} else {
		slot := (m.next - 1) % n
		if old := m.ring[slot]; m.at[old] == m.next-n {
			delete(m.at, old)
		}
		m.ring[slot] = id
	}
	m.at[id] = m.next
}

// take reports whether id was remembered, and forgets it.
func (m *ownMem) take(id predID) bool {
	if len(m.at) == 0 {
		return false
	}
	if _, ok := m.at[id]; !ok {
		return false
	}
	delete(m.at, id)
	return true
}

// dropReplica forgets every pair of r (its handle is reused by another
// replica).
func (m *ownMem) dropReplica(r Replica) {
	for id := range m.at {
		if id.r == r {
			delete(m.at, id)
		}
	}
}
