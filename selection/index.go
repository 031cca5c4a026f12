package selection

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// entry is one block of the approximate index: which replicas are believed
// to hold it, and its place in the LRU list.
type entry struct {
	key        uint64
	bits       mask
	prev, next uint32 // slab index + 1; 0 is none
}

// entryBytes is the accounted size of one entry: the slab entry plus up to
// four table slots (the table is kept between 1/4 and 1/2 full).
const entryBytes = 32 + 4*4

// Index is the approximate affinity index: for every block hash, the set of
// replicas that ramjet routed a prompt containing that block to. One memory
// budget bounds it, whatever the traffic; the least recently routed blocks
// are evicted first.
//
// Blocks are chained, and Learn touches a prompt's blocks from last to
// first, so a prefix's early blocks are always at least as recent as its
// later ones and eviction removes prefixes from the end. The set of blocks
// a replica holds along one chain is therefore prefix-closed, which lets
// Overlap find every replica's depth by bisection in O(k log n) lookups.
//
// Index is safe for concurrent use.
type Index struct {
	mu         sync.RWMutex
	table      []uint32 // open addressing, linear probing; slab index + 1
	shift      uint
	slab       []entry
	head, tail uint32
	maxEntries int
	budget     int64

	evictions atomic.Uint64
	entries   atomic.Int64
	bytes     atomic.Int64
}

// NewIndex returns an empty index bounded by budget bytes.
func NewIndex(budget int64) *Index {
	max := int(budget / entryBytes)
	if max < 1024 {
		max = 1024
	}
	x := &Index{maxEntries: max, budget: budget}
	x.grow(min(max, 4096))
	return x
}

// Budget is the memory budget in bytes.
func (x *Index) Budget() int64 { return x.budget }

// Bytes is the memory the index holds now, in bytes.
func (x *Index) Bytes() int64 { return x.bytes.Load() }

// Entries is the number of blocks the index holds.
func (x *Index) Entries() int64 { return x.entries.Load() }

// MaxEntries is the most blocks the budget allows.
func (x *Index) MaxEntries() int { return x.maxEntries }

// Evictions counts blocks evicted to stay within the budget.
func (x *Index) Evictions() uint64 { return x.evictions.Load() }

func (x *Index) slot(key uint64) uint64 {
	return (key * 0x9E3779B97F4A7C15) >> x.shift
}

// grow resizes the slab capacity to n entries and rebuilds the table.
func (x *Index) grow(n int) {
	slab := make([]entry, len(x.slab), n)
	copy(slab, x.slab)
	x.slab = slab
	size := 1
	for size < 2*n {
		size <<= 1
	}
	x.table = make([]uint32, size)
	x.shift = uint(64 - bits.TrailingZeros(uint(size)))
	mask := uint64(size - 1)
	for i := range x.slab {
		h := x.slot(x.slab[i].key)
		for x.table[h] != 0 {
			h = (h + 1) & mask
		}
		x.table[h] = uint32(i + 1)
	}
	x.bytes.Store(int64(cap(x.slab))*32 + int64(len(x.table))*4)
}

// find returns the table position of key and whether it is present; when
// absent the position is the empty slot where it would go.
func (x *Index) find(key uint64) (uint64, bool) {
	m := uint64(len(x.table) - 1)
	h := x.slot(key)
	for {
		e := x.table[h]
		if e == 0 {
			return h, false
		}
		if x.slab[e-1].key == key {
			return h, true
		}
		h = (h + 1) & m
	}
}

// get returns the replica set holding key (read lock held). It is find
// specialised for the lookup path: one probe loop, the bits read in place.
func (x *Index) get(key uint64) mask {
	table, slab := x.table, x.slab
	m := uint64(len(table) - 1)
	for h := x.slot(key); ; h = (h + 1) & m {
		e := table[h]
		if e == 0 {
			return mask{}
		}
		if en := &slab[e-1]; en.key == key {
			return en.bits
		}
	}
}

// remove deletes the table slot at h with backward-shift deletion.
func (x *Index) remove(h uint64) {
	m := uint64(len(x.table) - 1)
	i := h
	j := h
	for {
		j = (j + 1) & m
		e := x.table[j]
		if e == 0 {
			x.table[i] = 0
			return
		}
		k := x.slot(x.slab[e-1].key)
		// Leave e where it is if its home k lies cyclically in (i, j].
		if (i <= j && i < k && k <= j) || (i > j && (i < k || k <= j)) {
			continue
		}
		x.table[i] = e
		i = j
	}
}

func (x *Index) unlink(e uint32) {
	en := &x.slab[e-1]
	if en.prev != 0 {
		x.slab[en.prev-1].next = en.next
	} else {
		x.head = en.next
	}
	if en.next != 0 {
		x.slab[en.next-1].prev = en.prev
	} else {
		x.tail = en.prev
	}
	en.prev, en.next = 0, 0
}

func (x *Index) pushFront(e uint32) {
	en := &x.slab[e-1]
	en.prev = 0
	en.next = x.head
	if x.head != 0 {
		x.slab[x.head-1].prev = e
	}
	x.head = e
	if x.tail == 0 {
		x.tail = e
	}
}

// touch finds or inserts key, marks slot s as holding it and makes it the
// most recently used entry (write lock held).
func (x *Index) touch(key uint64, s Slot) {
	h, ok := x.find(key)
	if ok {
		e := x.table[h]
		x.slab[e-1].bits.Add(s)
		if x.head != e {
			x.unlink(e)
			x.pushFront(e)
		}
		return
	}
	var e uint32
	switch {
	case len(x.slab) < cap(x.slab):
		x.slab = append(x.slab, entry{})
		e = uint32(len(x.slab))
		x.entries.Add(1)
	case len(x.slab) < x.maxEntries:
		x.grow(min(x.maxEntries, 2*cap(x.slab)))
		x.slab = append(x.slab, entry{})
		e = uint32(len(x.slab))
		x.entries.Add(1)
		h, _ = x.find(key)
	default:
		// Evict the least recently used block and reuse its entry.
		e = x.tail
		x.unlink(e)
		eh, _ := x.find(x.slab[e-1].key)
		x.remove(eh)
		x.evictions.Add(1)
		h, _ = x.find(key)
	}
	x.slab[e-1] = entry{key: key}
	x.slab[e-1].bits.Add(s)
	x.table[h] = e
	x.pushFront(e)
}

// Learn records that slot s now holds every block of blocks. Blocks are
// touched from last to first so that a prefix's head stays the most recent.
func (x *Index) Learn(blocks []uint64, s Slot) {
	if len(blocks) == 0 {
		return
	}
	x.mu.Lock()
	for i := len(blocks) - 1; i >= 0; i-- {
		x.touch(blocks[i], s)
	}
	x.mu.Unlock()
}

// Forget drops slot s from every entry: the replica is treated as cold.
func (x *Index) Forget(s Slot) {
	x.mu.Lock()
	for i := range x.slab {
		x.slab[i].bits.Remove(s)
	}
	x.mu.Unlock()
}

// Depths sets depth[s] for every slot s in interest to the number of
// leading blocks of blocks that s is believed to hold. Slots outside
// interest are left untouched. It allocates nothing.
//
// The bisection runs breadth first: every open interval of a level is
// probed before any is split, so the level's index lookups are independent
// of each other and the processor overlaps their memory accesses (a depth
// first bisection chains every lookup on the previous one).
func (x *Index) Depths(blocks []uint64, interest mask, depth *[MaxReplicas]int32) {
	var w depthWork
	x.depths(blocks, interest, depth, &w)
}

// span is an open interval of the bisection: block lo is held by every
// slot of mlo and block hi by every slot of mhi, so the slots of
// mlo \ mhi have their boundary inside.
type span struct {
	lo, hi   int32
	mlo, mhi mask
}

// depthWork is the bisection's working memory (kept in Scratch so that a
// decision neither allocates nor clears it). Spans hold disjoint
// boundaries, so at most MaxReplicas are open at once.
type depthWork struct {
	bufs   [2][MaxReplicas]span
	probes [MaxReplicas]mask
}

func (x *Index) depths(blocks []uint64, interest mask, depth *[MaxReplicas]int32, w *depthWork) {
	n := len(blocks)
	if n == 0 || interest.zero() {
		return
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	m0 := x.get(blocks[0]).and(interest)
	if m0.zero() {
		return
	}
	mN := m0
	if n > 1 {
		mN = x.get(blocks[n-1]).and(m0)
	}
	setDepth(mN, int32(n), depth)

	cur, next, probes := &w.bufs[0], &w.bufs[1], &w.probes
	open := 0
	if !m0.andNot(mN).zero() {
		cur[0] = span{0, int32(n - 1), m0, mN}
		open = 1
	}
	for open > 0 {
		for i := range cur[:open] {
			if sp := &cur[i]; sp.hi-sp.lo > 1 {
				probes[i] = x.get(blocks[sp.lo+(sp.hi-sp.lo)/2])
			}
		}
		split := 0
		for i := range cur[:open] {
			sp := &cur[i]
			if sp.hi-sp.lo <= 1 {
				setDepth(sp.mlo.andNot(sp.mhi), sp.lo+1, depth)
				continue
			}
			mid := sp.lo + (sp.hi-sp.lo)/2
			mm := probes[i].and(sp.mlo).or(sp.mhi)
			if !sp.mlo.andNot(mm).zero() {
				next[split] = span{sp.lo, mid, sp.mlo, mm}
				split++
			}
			if !mm.andNot(sp.mhi).zero() {
				next[split] = span{mid, sp.hi, mm, sp.mhi}
				split++
			}
		}
		cur, next, open = next, cur, split
	}
}

// setDepth sets depth[s] = d for every slot s in m.
func setDepth(m mask, d int32, depth *[MaxReplicas]int32) {
	for w := range m {
		for v := m[w]; v != 0; v &= v - 1 {
			depth[w*64+bits.TrailingZeros64(v)] = d
		}
	}
}
