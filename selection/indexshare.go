package selection

import "cmp"

// indexShareOn reports whether Options.IndexShare applies to a replica of
// capa tokens of KV: always without IndexShareRoom (negative); with it
// (0: DefaultIndexShareRoom), only while a mean prompt is known and capa
// is at least IndexShareRoom times it.
func (rt *Router) indexShareOn(capa int64) bool {
	k := cmp.Or(rt.opt.IndexShareRoom, DefaultIndexShareRoom)
	if k < 0 {
		return true
	}
	avg := float64(rt.promptAvg.Load()) / promptAvgScale
	return avg > 0 && float64(capa) >= k*avg
}

// reapplyIndexShare hands every registered slot's capacity to the index
// again once the mean prompt moved by an eighth since the last time, so
// that IndexShareRoom's gate follows it (a reservation's cost only then).
func (rt *Router) reapplyIndexShare() {
	a, last := rt.promptAvg.Load(), rt.ixAvg.Load()
	if d := a - last; d < last/8 && -d < last/8 && last != 0 {
		return
	}
	if !rt.ixAvg.CompareAndSwap(last, a) {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for s := range Slot(rt.n.Load()) {
		if rt.keys[s] != "" {
			rt.applyCapacity(s)
		}
	}
}
