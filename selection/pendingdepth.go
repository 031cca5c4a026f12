package selection

// Overlap still being computed (Options.PendingDepth).
//
// The index learns a request's prompt on its replica when it is routed,
// before the engine has computed it. An agent whose next turn arrives while
// the previous turn still prefills (an open-loop trace replayed faster than
// its prefills: the tool-agent trace at 256 replicas, x4) finds its deepest
// overlap on that replica, whose pending prefill is that same context: the
// overlap and the charge for waiting on it cancel, the replica scores as a
// cold one less the in-flight request's cost, and the turn goes cold to a
// third replica (the rendezvous tie-break), where the next turn finds the
// same again. The engine does not share blocks another request is still
// computing, so the turn that waits there gains little either. Dynamo's
// index holds only what the engines stored and sends such a turn to the
// replica holding the computed part of the context.
//
// pendingDepth counts, on a replica, only the part of the overlap that was
// there before the in-flight requests still prefilling it: a request in
// flight on s whose prompt is a prefix of this one (at its whole length or
// at 15/16, 3/4 or 1/2 of it, reserveChain's depths) and that has not
// produced its first token bounds what s is believed to hold of this
// prompt by what it found cached there (its prompt less its pending
// prefill).

// pendingDepth is ov, what slot s is believed to hold of the prompt of
// blocks, less what requests still prefilling on s are computing of it.
func (rt *Router) pendingDepth(s Slot, blocks []uint64, ov int) int {
	if ov <= 0 || len(blocks) == 0 || rt.loads[s].pending.Load() <= 0 {
		return ov
	}
	bt := int64(rt.cfg.BlockTokens)
	nb := int32(len(blocks))
	eff := int64(ov)
	l := &rt.chains[s]
	l.mu.Lock()
	n := 0
	for j := l.head; j != nil && n < maxChainScan; j, n = j.next, n+1 {
		if j.state.Load() != 0 {
			continue
		}
		// j's prompt is a prefix of this one at its whole length or at
		// 15/16, 3/4 or 1/2 of it (reserveChain's depths: a prompt that
		// extends j's diverges at j's last, partial block).
		found := false
		for i, d := range j.depths {
			if d > 0 && d <= nb && blocks[d-1] == j.tips[i] {
				found = true
				break
			}
		}
		p := j.pend.Load()
		if !found || p <= 0 {
			continue
		}
		// What j found there when it was routed; its last p tokens are
		// still being computed.
		whole := int64(j.prompt)
		if whole <= 0 {
			whole = int64(j.depths[0]) * bt
		}
		eff = min(eff, max(0, whole-p))
	}
	l.mu.Unlock()
	return int(eff)
}
