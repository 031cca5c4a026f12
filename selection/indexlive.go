package selection

// applyIndexLive bounds slot s's index to its capacity less
// Options.IndexLive times what its requests in flight hold (scratch,
// cellb21: the engine's blocks serve the running requests and the prefix
// cache at once).
func (rt *Router) applyIndexLive(s Slot) {
	c := &rt.loads[s]
	capa := int64(c.kvtokens.Load())
	if capa <= 0 {
		return
	}
	if sh := rt.opt.IndexShare; sh > 0 && sh < 1 && rt.indexShareOn(capa) {
		capa = int64(float64(capa) * sh)
	}
	var held int64
	switch rt.opt.IndexLiveMode {
	case 1:
		held = c.pending.Load()
	case 2:
		held = int64(c.count()) * 1024
	default:
		held = c.resident.Load()
	}
	floor := rt.opt.IndexLiveFloor
	if floor <= 0 {
		floor = 0.5
	}
	it := max(int64(float64(capa)*floor), capa-int64(rt.opt.IndexLive*float64(held)))
	rt.idx.SetCapacity(s, max(1, it/int64(rt.cfg.BlockTokens)))
}

// queueExtraOn reports whether Options.QueueExtra applies on slot s: always
// without QueueExtraRoom; with it, only while a mean prompt is known and
// s's KV capacity is at least QueueExtraRoom times it.
func (rt *Router) queueExtraOn(s Slot) bool {
	k := rt.opt.QueueExtraRoom
	if k <= 0 {
		return true
	}
	avg := float64(rt.promptAvg.Load()) / promptAvgScale
	return avg > 0 && float64(rt.loads[s].kv()) >= k*avg
}
