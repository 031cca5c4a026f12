package kvindex

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// StoredFunc receives one applied BlockStored event: the replica's slot
// (as bound with Precise.Bind), the number of blocks the event stored, the
// block size in tokens and the time the engine published it (its batch's
// ts, or the time the index applied it where that is not plausible:
// publishedAt). It runs with the index locked, on the feed's goroutine: it
// must be quick and must not call back into the Index or the Precise
// service.
type StoredFunc func(s selection.Slot, blocks, blockTokens int, at time.Time)

// storedHook is what Index.Apply calls for each stored run (noteStored):
// own is how many of its blocks are this router's (ownRef), mine how many
// belong to its requests in flight (Index.store).
type storedHook struct {
	f func(r Replica, blocks, own, mine, blockTokens int, at time.Time)
}

// onStored sets the index's stored-run hook (nil: none).
func (x *Index) onStored(f func(r Replica, blocks, own, mine, blockTokens int, at time.Time)) {
	if f == nil {
		x.stored.Store(nil)
		return
	}
	x.stored.Store(&storedHook{f: f})
}

// noteStored hands one relevant BlockStored event of r, published at at
// (publishedAt), to the hook. Apply calls it under x.mu.
func (x *Index) noteStored(r Replica, e *Event, own, mine int, at time.Time) {
	if h := x.stored.Load(); h != nil && len(e.BlockHashes) > 0 {
		h.f(r, len(e.BlockHashes), own, mine, e.BlockSize, at)
	}
}

// MaxPublishLag bounds how far a batch's own timestamp may lie before its
// delivery for the stored-run hook to take it (publishedAt).
const MaxPublishLag = time.Second

// publishedAt is when the engine published a batch: its ts (Unix seconds,
// as vLLM and SGLang write it) when that lies within MaxPublishLag before
// now, else now (no ts, a clock ahead of this host's or far behind, a
// replayed batch). The stored-run hook compares it with this instance's
// first tokens (selection.ForeignPrefill's Grace), which are the engine's
// time too but for the network: the delivery of a batch can trail its
// publication by a scheduler's stall on a loaded router, and a stored run
// of this instance's own request delivered more than Grace after its first
// token read as another instance's prefill (TestE2EForeignOwnRuns, once in
// ~100 runs at load 10-25).
func publishedAt(ts float64, now time.Time) time.Time {
	if !(ts > 0 && ts < 1e11) { // also NaN and what overflows a time
		return now
	}
	sec, frac := math.Modf(ts)
	t := time.Unix(int64(sec), int64(frac*1e9))
	if t.After(now) || now.Sub(t) > MaxPublishLag {
		return now
	}
	return t
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
	p.onStored(func(s selection.Slot, blocks, _, _, blockTokens int, at time.Time) { f(s, blocks, blockTokens, at) })
}

// onStored is OnStored with, for each run, how many of its blocks the
// index marks as this router's own (Index.Own) and how many belong to this
// router's requests in flight on the replica (Index.store).
func (p *Precise) onStored(f func(s selection.Slot, blocks, own, mine, blockTokens int, at time.Time)) {
	slots := new(slotCache)
	p.x.onStored(func(r Replica, blocks, own, mine, blockTokens int, at time.Time) {
		if s, ok := slots.slotOf(p, r); ok {
			f(s, blocks, own, mine, blockTokens, at)
		}
	})
}

// SetForeign makes fp the estimate of the prefill other routers put on
// the replicas (nil: none): it receives every stored run with the blocks
// of it the index marks as this router's own and those of this router's
// requests in flight there (fp.StoredRunOwn: an own request's blocks
// recomputed past its reservation, after a preemption or an eviction while
// it queued, are not another instance's prefill) and,
// from a Late handle whose tokens came after its request was routed on the
// bytes' estimate of its prompt, the tokens past that estimate as this
// instance's own (ForeignPrefill.Credit). With fp.OwnInflight the index
// keeps its requests' blocks in flight (Index.Inflight) from now on.
func (p *Precise) SetForeign(fp *selection.ForeignPrefill) {
	p.x.trackInflight(fp != nil && fp.OwnInflight)
	if fp == nil {
		p.foreign.Store(nil)
		p.OnStored(nil)
		return
	}
	p.onStored(fp.StoredRunOwn)
	p.foreign.Store(fp)
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
