package integrity

import "github.com/ramjet-llm/ramjet/selection"

// Remove stops checking the replica key (it left the fleet) and forgets its
// admission state. Commitments stay in the Store: an engine instance that
// comes back under a key Add-ed again is fenced as before.
func (m *Monitor) Remove(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.reps, key)
	delete(m.out, key)
}

// Forget stops checking the replica key that left the fleet and clears the
// slot it held (the fleet's unregister hook, run before the slot is
// reused), so the next replica in that slot is not held out by the old
// one's verdict.
func (g *Service) Forget(s selection.Slot, key string) {
	g.mu.Lock()
	delete(g.known, key)
	g.mu.Unlock()
	g.mon.Remove(key)
	if s >= 0 && int(s) < len(g.out) {
		g.out[s].Store(false)
	}
}
