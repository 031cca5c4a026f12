package selection

// Pins: the blocks of requests in flight, which the engine does not evict.
//
// An engine (vLLM, SGLang, the fleet simulation's) never evicts a block a
// running request references: its LRU is over the blocks no request
// holds. The capacity bound (Index.bound) drops a replica's least
// recently sent beliefs, in flight or not, so on a replica whose requests
// run long after they were sent (a queue, long prompts) it presumes
// evicted the prefixes its running requests still pin, a shared system
// prompt first, and the next request that shares them reads the replica
// as cold. With Options.PinInflight, Route pins the prompt's pairs on the
// chosen replica until the request is released: the bound passes them by
// (they still count against the capacity) and, released, they go back to
// the least recent end of the list (PinTail), or to its most recent end
// (PinHead: the engine's LRU orders by release, not by send).
//
// A pinned pair the bound reaches is set aside on the replica's pinned
// list; at most the replica's capacity is kept there, past it the bound
// drops pinned pairs too (a replica cannot hold more than its capacity).

// pinned marks a pair's pin count in Index.pins as set aside (on its
// replica's pinned list, off its LRU list).
const pinAside = 1 << 30

// PinMode says where a released request's pairs go that the capacity
// bound had set aside while they were pinned.
type PinMode uint8

const (
	// PinOff: no pins (the rule before).
	PinOff PinMode = iota
	// PinTail: back at the least recent end, in prefix order: what was
	// kept only for the request is the first to go.
	PinTail
	// PinHead: to the most recent end, as the engine's LRU puts blocks a
	// finished request releases.
	PinHead
	// PinRelearn: the whole prompt touched again at release (every pair
	// of it to the most recent end).
	PinRelearn
)

// ensurePins allocates the pin counts (write lock held).
func (x *Index) ensurePins() {
	if len(x.pins) < cap(x.pairs) {
		p := make([]int32, cap(x.pairs))
		copy(p, x.pins)
		x.pins = p
		x.accountBytes()
	}
}

// aside reports whether pair e is on its replica's pinned list.
func (x *Index) aside(e uint32) bool {
	return x.pins != nil && x.pins[e-1]&pinAside != 0
}

// pinnedPair reports whether pair e has a pin.
func (x *Index) pinnedPair(e uint32) bool {
	return x.pins != nil && x.pins[e-1]&^pinAside != 0
}

// setAside moves pair e (pinned, on its LRU list) to its replica's pinned
// list.
func (x *Index) setAside(e uint32) {
	x.unlinkPair(e)
	p := &x.pairs[e-1]
	r := &x.reps[p.slot]
	p.prev, p.next = 0, r.shead
	if r.shead != 0 {
		x.pairs[r.shead-1].prev = e
	}
	r.shead = e
	x.pins[e-1] |= pinAside
	r.aside++
}

// unlinkAside takes pair e off its replica's pinned list.
func (x *Index) unlinkAside(e uint32) {
	p := &x.pairs[e-1]
	r := &x.reps[p.slot]
	if p.prev != 0 {
		x.pairs[p.prev-1].next = p.next
	} else {
		r.shead = p.next
	}
	if p.next != 0 {
		x.pairs[p.next-1].prev = p.prev
	}
	p.prev, p.next = 0, 0
	x.pins[e-1] &^= pinAside
	r.aside--
}

// pushTail puts pair e (on no list) at the least recent end of its
// replica's LRU list.
func (x *Index) pushTail(e uint32) {
	p := &x.pairs[e-1]
	r := &x.reps[p.slot]
	p.prev, p.next = r.tail, 0
	if r.tail != 0 {
		x.pairs[r.tail-1].next = e
	} else {
		r.head = e
	}
	r.tail = e
}

// pinLocked adds a pin to slot s's pairs of blocks (write lock held).
func (x *Index) pinLocked(blocks []uint64, s Slot) {
	x.ensurePins()
	for _, k := range blocks {
		if _, e := x.findBlock(k); e != 0 {
			if pe := x.pairOf(e, s); pe != 0 {
				x.pins[pe-1]++
			}
		}
	}
}

// unpin drops a pin from slot s's pairs of blocks (Route pinned them) and
// puts back, as mode says, the pairs that no longer have one.
func (x *Index) unpin(blocks []uint64, s Slot, mode PinMode) {
	if len(blocks) == 0 || s < 0 {
		return
	}
	x.lock()
	defer x.mu.Unlock()
	if x.pins == nil || int(s) >= len(x.reps) {
		return
	}
	r := &x.reps[s]
	if mode == PinRelearn {
		x.touchEach(blocks, s)
	}
	// Prefix order: the root first, so that at the tail the deepest is
	// the least recent; at the head the root is the most recent.
	for i := range blocks {
		k := blocks[i]
		if mode == PinHead {
			k = blocks[len(blocks)-1-i]
		}
		_, e := x.findBlock(k)
		if e == 0 {
			continue
		}
		pe := x.pairOf(e, s)
		if pe == 0 || !x.pinnedPair(pe) {
			continue
		}
		x.pins[pe-1]--
		if x.pins[pe-1] != pinAside {
			continue // still pinned, or on the LRU list
		}
		x.unlinkAside(pe)
		switch mode {
		case PinHead, PinRelearn:
			r.clock++
			x.pairs[pe-1].stamp = r.clock
			x.pushPair(pe)
		default:
			x.pushTail(pe)
		}
	}
	x.bound(s)
}

// queueSlack is the index's slack for slot s (Options.QueueSlack): its
// pending prefill in blocks; -1 (leave it) when off.
func (rt *Router) queueSlack(s Slot) int64 {
	if !rt.opt.QueueSlack {
		return -1
	}
	return max(0, rt.loads[s].pending.Load()) / int64(rt.cfg.BlockTokens)
}

// boundSlack applies slot s's smaller slack once a request's prefill is
// done or dropped (Options.QueueSlack).
func (rt *Router) boundSlack(s Slot) {
	if sl := rt.queueSlack(s); sl >= 0 {
		rt.idx.setSlack(s, sl)
	}
}

// setSlack sets slot s's slack and bounds it.
func (x *Index) setSlack(s Slot, blocks int64) {
	x.lock()
	defer x.mu.Unlock()
	if int(s) >= len(x.reps) || s < 0 {
		return
	}
	x.reps[s].slack = blocks
	x.bound(s)
}

// shareOnce is reserveChain's count under Options.SharedOnce: in-flight
// j on the replica no longer counts in l.kv the blocks it shares with the
// new prompt blocks (which counts them), beyond those it gave up already
// (l.mu held).
func (rt *Router) shareOnce(l *chainList, j *Reservation, blocks []uint64) {
	d := sharedDepth(blocks, j.pins)
	if d <= j.shared || j.kv == 0 {
		return
	}
	sub := min(j.kv, int64(d-j.shared)*int64(rt.cfg.BlockTokens))
	j.kv -= sub
	l.kv.Add(-sub)
	j.shared = d
}

// sharedDepth is how many leading blocks a and b share. Blocks are
// chained (each hash covers its prefix), so the predicate "block k-1 is
// equal" holds for every k up to the depth and none past it: a bisection.
func sharedDepth(a, b []uint64) int32 {
	lo, hi := 0, min(len(a), len(b)) // a[:lo] shared; a[hi] not known
	for lo < hi {
		m := lo + (hi-lo+1)/2
		if a[m-1] == b[m-1] {
			lo = m
		} else {
			hi = m - 1
		}
	}
	return int32(lo)
}
