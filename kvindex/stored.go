package kvindex

import (
	"sync/atomic"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// StoredFunc receives one applied BlockStored event: the replica's slot
// (as bound with Precise.Bind), the number of blocks the event stored, the
// block size in tokens and the time the index applied it. It runs with
// the index locked, on the feed's goroutine: it must be quick and must not
// call back into the Index or the Precise service.
type StoredFunc func(s selection.Slot, blocks, blockTokens int, at time.Time)

// storedHook is what Index.Apply calls for each stored run (noteStored).
type storedHook struct {
	f func(r Replica, blocks, blockTokens int, at time.Time)
}

// onStored sets the index's stored-run hook (nil: none).
func (x *Index) onStored(f func(r Replica, blocks, blockTokens int, at time.Time)) {
	if f == nil {
		x.stored.Store(nil)
		return
	}
	x.stored.Store(&storedHook{f: f})
}

// noteStored hands one relevant BlockStored event of r to the hook. Apply
// calls it under x.mu.
func (x *Index) noteStored(r Replica, e *Event, now time.Time) {
	if h := x.stored.Load(); h != nil && len(e.BlockHashes) > 0 {
		h.f(r, len(e.BlockHashes), e.BlockSize, now)
	}
}

// OnStored makes f receive every BlockStored event the feeds apply (GPU
// tier, first KV-cache group, whether or not its blocks could be keyed) of
// a replica bound to a slot; events of unbound replicas are dropped. It is
// what an estimate of the prefill other routers put on a replica reads
// (selection.ForeignPrefill.StoredRun): every ramjet instance subscribes
// to every engine, so each sees the block runs the others' requests
// store. nil turns it off. Memory is fixed: one cached slot per replica.
func (p *Precise) OnStored(f StoredFunc) {
	if f == nil {
		p.x.onStored(nil)
		return
	}
	slots := new(slotCache)
	p.x.onStored(func(r Replica, blocks, blockTokens int, at time.Time) {
		if s, ok := slots.slotOf(p, r); ok {
			f(s, blocks, blockTokens, at)
		}
	})
}

// slotCache maps a Replica to the slot bound to it (Precise.Bind), the
// inverse of Precise.bySlot: each entry is slot+1 (0: not cached), checked
// against bySlot on every use, so a rebinding is found by one scan.
type slotCache [MaxReplicas]atomic.Int32

func (c *slotCache) slotOf(p *Precise, r Replica) (selection.Slot, bool) {
	if r < 0 || int(r) >= len(c) {
		return -1, false
	}
	if v := c[r].Load(); v > 0 && p.bySlot[v-1].Load() == int32(r)+1 {
		return selection.Slot(v - 1), true
	}
	for s := range p.bySlot {
		if p.bySlot[s].Load() == int32(r)+1 {
			c[r].Store(int32(s) + 1)
			return selection.Slot(s), true
		}
	}
	c[r].Store(0)
	return -1, false
}
