package selection

// DefaultAgentMoveRoom is Options.AgentMoveRoom's default: an agent leaves
// a crowded home only for a replica whose in-flight context, with the
// agent's prompt, is at most half its KV capacity (bench/EXPERIMENTS.md
// section 49: a target at 0.65 or at the home's own bound took the
// overflow over and moved the tail there).
const DefaultAgentMoveRoom = 0.5

// agentMove reports whether the request's home, cands[h] (the one replica
// holding strictly most of its prompt, ov tokens of it), pays the pair term
// like every other replica (Options.AgentMove): this router's context in
// flight there with the request's new tokens passes AgentMove times the
// home's KV capacity, the request's own context is the smallest in flight
// there (no other in-flight context of at least 64 blocks is shorter than
// ov by 8 blocks or more), and another usable replica has room for the
// prompt under AgentMoveRoom times its capacity. The agent then moves
// where the resident context is shortest while the home still fits it,
// and the one that moves is the cheapest to recompute.
func (rt *Router) agentMove(cands []Candidate, h, prompt, ov int) bool {
	room := rt.opt.AgentMoveRoom
	if room <= 0 {
		room = DefaultAgentMoveRoom
	}
	fits := false
	for i := range cands {
		if i != h && cands[i].Usable {
			c := &rt.loads[cands[i].Slot]
			if float64(c.resident.Load()+int64(prompt)) <= room*float64(c.kv()) {
				fits = true
				break
			}
		}
	}
	c := &rt.loads[cands[h].Slot]
	if !fits || float64(c.resident.Load()+int64(prompt-ov)) <= rt.opt.AgentMove*float64(c.kv()) {
		return false
	}
	lo, bt := int64(64*rt.cfg.BlockTokens), int64(8*rt.cfg.BlockTokens)
	l := &rt.chains[cands[h].Slot]
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for j := l.head; j != nil && n < maxChainScan; j, n = j.next, n+1 {
		if j.resident >= lo && j.resident < int64(ov)-bt {
			return false
		}
	}
	return true
}
