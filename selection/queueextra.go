package selection

// queueExtraOn reports whether Options.QueueExtra applies on slot s: with
// QueueExtraFull, only while the index believes s holds at least that share
// of its capacity; with QueueExtraRoom, only while a mean prompt is known
// and s's KV capacity is at least QueueExtraRoom times it.
func (rt *Router) queueExtraOn(s Slot) bool {
	if f := rt.opt.QueueExtraFull; f > 0 {
		c := rt.idx.Capacity(s)
		if c <= 0 || float64(rt.idx.Held(s)) < f*float64(c) {
			return false
		}
	}
	k := rt.opt.QueueExtraRoom
	if k <= 0 {
		return true
	}
	avg := float64(rt.promptAvg.Load()) / promptAvgScale
	return avg > 0 && float64(rt.loads[s].kv()) >= k*avg
}
