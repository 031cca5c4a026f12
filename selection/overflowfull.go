package selection

// fleetFull reports whether no usable candidate has room for a prompt of
// prompt tokens: on every one, this router's context in flight plus the
// prompt passes the KV capacity (Options.OverflowFull). Then every
// replica pays the overflow term, and its weight only sets how much
// resident context outweighs overlap and pending prefill; where some
// replica has room the term keeps its weight, which moves an agent off a
// crowded home to it.
func (rt *Router) fleetFull(cands []Candidate, prompt int) bool {
	seen := false
	for i := range cands {
		if !cands[i].Usable {
			continue
		}
		c := &rt.loads[cands[i].Slot]
		if c.resident.Load()+int64(prompt) <= c.kv() {
			return false
		}
		seen = true
	}
	return seen
}
