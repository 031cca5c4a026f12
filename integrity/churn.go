package integrity

// Remove stops checking the replica key (it left the fleet) and forgets its
// admission state. Commitments stay in the Store: an engine instance that
// comes back under a key Add-ed again is fenced as before.
func (m *Monitor) Remove(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.reps, key)
	delete(m.out, key)
}
