package selection

// Options.IndexPending: the index's bound on a replica counts the prompt
// tokens this router sent there that the engine has not computed yet (the
// replica's pending prefill) outside the replica's capacity. The index
// learns a prompt when it routes it, but a queued request's uncached
// blocks take no room in the engine's cache until it is admitted; without
// the slack they push the index's least recent beliefs out while the
// engine still holds them (on an overloaded fleet with little KV, deeper
// shared prefixes the index then ranks below a shallower holder).

// limit is replica r's capacity in blocks (0: unbounded) with the slack
// Options.IndexPending adds (write lock held).
func (x *Index) limit(r *holder, s Slot) int64 {
	if r.capacity > 0 && x.slack != nil {
		return r.capacity + max(0, x.slack(s, r.capacity))
	}
	return r.capacity
}

// setSlack installs (or with nil removes) the per-replica slack of the
// index's capacity bound, in blocks.
func (x *Index) setSlack(f func(s Slot, capacity int64) int64) {
	x.lock()
	defer x.unlock()
	x.slack = f
}

// applyIndexPending installs Options.IndexPending's slack on the shared
// index when the option is on: K times the replica's pending prefill, in
// blocks, at most Options.IndexPendingMax times the replica's capacity
// (0 or negative: no bound).
func (rt *Router) applyIndexPending() {
	k := rt.opt.IndexPending
	if !(k > 0) {
		return
	}
	bt := float64(rt.cfg.BlockTokens)
	loads := &rt.loads
	most := rt.opt.IndexPendingMax
	rt.idx.setSlack(func(s Slot, capacity int64) int64 {
		if s < 0 || int(s) >= len(loads) {
			return 0
		}
		n := k * float64(loads[s].pending.Load()) / bt
		if most > 0 {
			n = min(n, most*float64(capacity))
		}
		return int64(n)
	})
}
