package selection

import (
	"sync"
	"sync/atomic"
)

// The learn queue takes a routed prompt's learn off the request's path:
// Route copies the prompt's blocks into the queue and a goroutine applies
// them under the index's write lock while the request is forwarded. Every
// reader and writer of the index applies the queued learns first (rlock,
// lock), so what anyone reads is what the synchronous learn would have
// left: decisions are identical, and the queue only changes when the work
// is done and on which core. A full queue is never dropped from: Route
// then learns inline, after the queued learns.
//
// Off by default (SetLearnQueue): the fleet simulation learns inline.

// DefaultLearnQueueBlocks is the fewest blocks new to the chosen replica
// (32 KiB of prompt at the default block size) for which the Caddy module
// queues a learn. A learn's cost is in those blocks (each one inserted,
// and as many old beliefs dropped past the replica's capacity or
// horizon); blocks the replica already holds are moved as one run.
// Handing a learn to the applier costs a goroutine wake-up and a copy of
// the blocks, about 6 µs of CPU (BenchmarkSelectObserved/body=64KiB, whose
// conversations resend a held prompt: +6 µs per request when every learn
// of its 256 blocks was queued), which a smaller learn does not repay.
const DefaultLearnQueueBlocks = 128

// maxQueuedBlocks bounds the blocks waiting in the queue (8 bytes each,
// twice over: the queue and its spare).
const maxQueuedBlocks = 1 << 16

// learnTicket is where a queued learn leaves its probe age (learn's
// result) for Observe: age is valid once pending is false.
type learnTicket struct {
	age     atomic.Int64
	clock   atomic.Int64 // the replica's clock once learned
	pending atomic.Bool
}

// queuedLearn is one learn waiting in the queue: blocks off..off+n of
// the queue's block buffer, for slot s, probing block probe.
type queuedLearn struct {
	t      *learnTicket
	off, n int32
	probe  int32
	s      Slot
}

// learnQueue is the Index's queue of learns (Index.q).
type learnQueue struct {
	min     atomic.Int32 // the fewest blocks new to the replica a learn must have to be queued (0: off)
	waiting atomic.Int32 // learns queued and not yet applied

	mu      sync.Mutex // guards items, blocks and running
	items   []queuedLearn
	blocks  []uint64
	running bool // an applier goroutine is live

	// The buffers the applier swaps in (under the index's write lock).
	spareItems  []queuedLearn
	spareBlocks []uint64

	queued, inline atomic.Uint64 // learns queued; learns of queueing size learned inline (queue full)
}

// SetLearnQueue makes Route queue the learn of every prompt with at least
// minBlocks blocks beyond those the chosen replica was believed to hold
// (its predicted depth), to be applied on another goroutine (0: learn
// inline, the default). The index applies queued learns before any read or write,
// so decisions are the same either way; the queue moves the work off the
// request's path, onto an idle core when there is one.
func (x *Index) SetLearnQueue(minBlocks int) {
	x.q.min.Store(int32(max(0, min(minBlocks, maxQueuedBlocks))))
}

// QueuedLearns counts the learns Route queued, and the learns of queueing
// size it made inline because the queue was full.
func (x *Index) QueuedLearns() (queued, inline uint64) {
	return x.q.queued.Load(), x.q.inline.Load()
}

// learnOrQueue is learn (its age left in t), queued when the queue is on,
// at least its minimum of blocks lie past probe (the blocks the replica
// was believed to hold: Route's prediction) and the queue is not full;
// held is learnLocked's (a queued learn seeks its run regardless).
func (x *Index) learnOrQueue(blocks []uint64, s Slot, probe, held int, t *learnTicket) {
	if m := int(x.q.min.Load()); m > 0 && len(blocks)-max(probe, 0) >= m && s >= 0 {
		if x.enqueue(blocks, s, probe, t) {
			return
		}
		x.q.inline.Add(1)
	}
	t.age.Store(x.learnTo(blocks, s, probe, held, t))
}

// enqueue queues a learn, starting the applier if none runs; false when
// the queue is full.
func (x *Index) enqueue(blocks []uint64, s Slot, probe int, t *learnTicket) bool {
	q := &x.q
	q.mu.Lock()
	if len(q.blocks)+len(blocks) > maxQueuedBlocks {
		q.mu.Unlock()
		return false
	}
	off := len(q.blocks)
	q.blocks = append(q.blocks, blocks...)
	q.items = append(q.items, queuedLearn{t: t, off: int32(off), n: int32(len(blocks)), probe: int32(probe), s: s})
	t.pending.Store(true)
	q.waiting.Add(1)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	q.queued.Add(1)
	if start {
		go x.applyLoop()
	}
	return true
}

// applyLoop applies queued learns until the queue is empty.
func (x *Index) applyLoop() {
	q := &x.q
	for {
		x.mu.Lock()
		x.applyQueued()
		x.unlock()
		q.mu.Lock()
		if len(q.items) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// applyQueued applies every queued learn, in order (write lock held).
func (x *Index) applyQueued() {
	q := &x.q
	if q.waiting.Load() == 0 {
		return
	}
	q.mu.Lock()
	items, blocks := q.items, q.blocks
	q.items, q.blocks = q.spareItems[:0], q.spareBlocks[:0]
	q.mu.Unlock()
	for i := range items {
		it := &items[i]
		age := x.learnLocked(blocks[it.off:it.off+it.n], it.s, int(it.probe), -1)
		it.t.clock.Store(x.reps[it.s].clock)
		it.t.age.Store(age)
		it.t.pending.Store(false)
		it.t = nil
	}
	q.waiting.Add(-int32(len(items)))
	q.spareItems, q.spareBlocks = items[:0], blocks[:0]
}

// lock takes the index's write lock with the queued learns applied.
func (x *Index) lock() {
	x.mu.Lock()
	x.applyQueued()
}

// rlock takes the index's read lock with the queued learns applied; when
// some were waiting it takes the write lock instead and reports so
// (runlock releases either).
func (x *Index) rlock() (write bool) {
	if x.q.waiting.Load() == 0 {
		x.mu.RLock()
		if x.q.waiting.Load() == 0 {
			return false
		}
		x.mu.RUnlock()
	}
	x.lock()
	return true
}

func (x *Index) runlock(write bool) {
	if write {
		x.unlock()
	} else {
		x.mu.RUnlock()
	}
}

// settle applies the queued learns, if any, so that the counters read
// without the lock (Entries, Bytes, ...) include them.
func (x *Index) settle() {
	if x.q.waiting.Load() != 0 {
		x.lock()
		x.unlock()
	}
}

// settled waits for t's queued learn to be applied (applying it if need
// be) and returns its age.
func (x *Index) settled(t *learnTicket) int64 {
	if t.pending.Load() {
		x.settle()
	}
	return t.age.Load()
}
