package selection

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// block is one block hash of the approximate index: its place in the
// global LRU list and how many replicas are believed to hold it. Which
// replicas is the block's holder set, w words of Index.bits.
type block struct {
	key   uint64
	links       // global LRU list, or the ghost list
	pairs int32 // replicas holding it; ghost for a ghost
	// hint is one of its pairs (0 none): most blocks have one holder. The
	// hint pair is found through it and is not in the pair table, so that
	// a block held by one replica costs no pair-table probe to add, find
	// or drop.
	hint uint32
}

// pair is one (block, replica) belief: the replica is presumed to hold the
// block. Pairs of one replica form its own LRU list, which models that
// replica's prefix cache (capacity, horizon).
type pair struct {
	blk   uint32 // block slab index + 1; 0 for a free entry
	slot  Slot
	links       // the replica's LRU list; next links the free list
	stamp int64 // the replica's clock at the last touch
}

// ghost is block.pairs of a ghost: a block no replica holds any more whose
// key stays in the block table, on the ghost list, until its entry is
// needed for another block (allocBlock takes the newest, the likeliest
// still in the processor's cache: faster than the oldest first in
// bench/EXPERIMENTS.md section 47). A prompt learned again after its
// blocks were dropped (an engine that reports no cached
// tokens: every answer's horizon drops the replica's oldest prompts) finds
// them there and takes them back without a table insertion, and dropping
// a block costs no table deletion. Lookups see a ghost as absent, and a
// ghost counts as a free entry (the slab grows and the budget evicts when
// neither a free entry nor a ghost is left), so that what the index
// believes is what it would believe without them.
const ghost = -1

// links places a block or a pair in a doubly linked list of slab entries
// (slab index + 1, 0 none).
type links struct{ prev, next uint32 }

// spliceFront moves the run first..last (consecutive along next) of the
// list head..tail to its front; node gives an entry's links.
func spliceFront(node func(uint32) *links, head, tail *uint32, first, last uint32) {
	if *head == first {
		return
	}
	f, l := node(first), node(last)
	before, after := f.prev, l.next
	node(before).next = after // before != 0: first is not the head
	if after != 0 {
		node(after).prev = before
	} else {
		*tail = before
	}
	f.prev = 0
	l.next = *head
	node(*head).prev = last
	*head = first
}

func (x *Index) blockLinks(e uint32) *links { return &x.blocks[e-1].links }
func (x *Index) pairLinks(e uint32) *links  { return &x.pairs[e-1].links }

// holder is one replica's view of its LRU list.
type holder struct {
	head, tail uint32
	blocks     int64 // pairs on the list
	clock      int64 // blocks ever touched for the replica
	capacity   int64 // most blocks it holds (0: unbounded)
	horizon    int64 // touches after which a block is presumed evicted (0: unbounded)
}

// Accounted sizes in bytes (slab entry; tables are counted by their size).
const (
	blockBytes  = 24
	pairBytes   = 24
	holderBytes = 48
	// entryBytes is the accounted size of one block held by one replica,
	// tables included (kept between 1/4 and 1/2 full): what MaxEntries
	// divides the budget by.
	entryBytes = blockBytes + 8 + 4*3 + pairBytes + 4*3
	minSlab    = 256
)

// Index is the approximate affinity index: for every block hash, the set of
// replicas that ramjet routed a prompt containing that block to, each
// replica's beliefs kept as its own LRU list of (block, replica) pairs.
//
// Three bounds apply. One memory budget bounds the whole index, whatever
// the traffic and the fleet size; the least recently routed blocks are
// evicted first, from every replica. A replica's capacity (SetCapacity, in
// blocks) bounds what it is believed to hold: what ramjet sent it beyond
// its capacity is presumed evicted in LRU order, as the engine would. A
// replica's horizon (SetHorizon, in blocks touched since) drops beliefs
// older than what the engine was seen to keep (Router's Observe learns it).
//
// Blocks are chained, and Learn touches a prompt's blocks from last to
// first, so a prefix's early blocks are always at least as recent as its
// later ones and each of the three evictions removes prefixes from the
// end. The set of blocks a replica holds along one chain is therefore
// prefix-closed, which lets Depths find every replica's depth by bisection
// in O(k log n) lookups.
//
// Holder sets are as wide as the highest slot used (one 64-bit word per 64
// replicas), so a small fleet pays for a small one. Index is safe for
// concurrent use.
type Index struct {
	mu sync.RWMutex

	btab   []uint32 // block table: open addressing, linear probing; see bentry
	bshift uint
	bmask  uint32 // the slab index bits of a btab entry (1<<ibits - 1), all when untagged
	ibits  uint   // the tag's shift
	fshift uint   // the fingerprint's shift in the key's hash
	fmask  uint32 // the fingerprint's bits
	blocks []block
	bits   []uint64 // holder sets, w words per block entry
	w      int
	head   uint32 // global LRU: most recent
	tail   uint32
	ghead  uint32 // the ghost list: oldest first, in the order dropped
	gtail  uint32
	ghosts int       // ghosts on the list
	gone   uint64    // block-table entries deleted
	cut    [2]uint64 // the positions the last deletion changed, first and last

	ptab   []uint32 // pair table
	pshift uint
	pairs  []pair
	pfree  uint32
	// pairStuck is the pair slab's capacity and the bytes held when
	// pairGrowth last found no room to grow: with the budget fixed, the
	// answer depends on nothing else.
	pairStuck [2]int64

	reps   []holder
	budget int64

	warmSink uint32 // keeps warm's loads

	ahead     []uint32 // dropAhead's entries, one per block
	aheadKeys []uint64 // dropAhead's set of keys
	noTail    bool     // ghostTail off (tests: the full path's reference)

	// The counts, kept under the write lock (n) and published for the
	// readers that take no lock when it is released (unlock): an atomic
	// add per block inserted or dropped would cost more than the rest of
	// a long prompt's learn.
	n         counts
	evictions atomic.Uint64 // blocks evicted by the budget
	dropped   atomic.Uint64 // pairs dropped by capacity or horizon
	entries   atomic.Int64  // live blocks
	npairs    atomic.Int64  // live pairs
	bytes     atomic.Int64

	q learnQueue // learns Route queued, not yet applied (learnq.go)
}

// counts are the Index's counters under its write lock.
type counts struct {
	evictions, dropped uint64
	entries, pairs     int64
}

// unlock publishes the counts and releases the write lock.
func (x *Index) unlock() {
	x.evictions.Store(x.n.evictions)
	x.dropped.Store(x.n.dropped)
	x.entries.Store(x.n.entries)
	x.npairs.Store(x.n.pairs)
	x.mu.Unlock()
}

// NewIndex returns an empty index bounded by budget bytes.
func NewIndex(budget int64) *Index {
	x := &Index{budget: budget, w: 1}
	x.growBlocks(minSlab)
	x.growPairs(minSlab)
	return x
}

// Budget is the memory budget in bytes.
func (x *Index) Budget() int64 { return x.budget }

// Bytes is the memory the index holds now, in bytes.
func (x *Index) Bytes() int64 { x.settle(); return x.bytes.Load() }

// Entries is the number of blocks the index holds.
func (x *Index) Entries() int64 { x.settle(); return x.entries.Load() }

// Pairs is the number of (block, replica) beliefs the index holds.
func (x *Index) Pairs() int64 { x.settle(); return x.npairs.Load() }

// MaxEntries is the most blocks the budget allows when each is on one
// replica of a fleet of up to 64.
func (x *Index) MaxEntries() int { return int(x.budget / entryBytes) }

// Evictions counts blocks evicted to stay within the budget.
func (x *Index) Evictions() uint64 { x.settle(); return x.evictions.Load() }

// Dropped counts (block, replica) beliefs dropped by a replica's capacity
// or horizon.
func (x *Index) Dropped() uint64 { x.settle(); return x.dropped.Load() }

func (x *Index) accountBytes() {
	x.bytes.Store(int64(cap(x.blocks))*blockBytes + int64(cap(x.bits))*8 + int64(len(x.btab))*4 +
		int64(cap(x.pairs))*pairBytes + int64(len(x.ptab))*4 + int64(cap(x.reps))*holderBytes)
}

// tableSize is the size of a table for n entries: the least power of two
// at least 2n (1 for none). The budget checks of a full index ask it at
// every allocation (blockGrowth, pairGrowth): no loop.
func tableSize(n int) int {
	if n <= 0 {
		return 1
	}
	return 1 << bits.Len(uint(2*n-1))
}

func (x *Index) bslot(key uint64) uint64 { h, _ := x.bhash(key); return h }

func pairKey(blk uint32, s Slot) uint64 { return uint64(blk)<<32 | uint64(uint32(s)) }

func (x *Index) pslot(blk uint32, s Slot) uint64 {
	return (mix64(pairKey(blk, s)) * 0x9E3779B97F4A7C15) >> x.pshift
}

// A block-table entry is the slab index + 1 of its block (0: empty) in
// its low ibits bits and, above them, a tag: its displacement (how far
// past its home position, the key's bslot, it lies; farDisp when that is
// farDisp or more) and a fingerprint of its key (the bits of the key's
// hash below those of its home). A lookup reads the slab only for the
// entries whose tag is the key's at that displacement, and deletion moves
// entries back without reading their keys: both would otherwise cost a
// cache miss per entry met. ibits is as narrow as the slab allows; a slab
// of 1<<maxIdxBits entries or more (a budget of over a GiB) leaves the
// entries untagged (bmask all ones): all 32 bits are the index, and every
// key and displacement is read from the slab.
const (
	dispBits   = 4
	farDisp    = 1<<dispBits - 1
	maxIdxBits = 24
)

// bhash is key's home position in the block table and its fingerprint.
func (x *Index) bhash(key uint64) (home uint64, fp uint32) {
	p := key * 0x9E3779B97F4A7C15
	return p >> x.bshift, uint32(p>>x.fshift) & x.fmask
}

// tagged reports whether block-table entries carry tags.
func (x *Index) tagged() bool { return x.bmask != ^uint32(0) }

// btag is the tag of an entry of fingerprint fp at displacement d.
func btag(fp uint32, d uint64) uint32 { return fp<<dispBits | uint32(min(d, farDisp)) }

// bentry is the table entry of slab index + 1 e, of fingerprint fp, at
// displacement d.
func (x *Index) bentry(e, fp uint32, d uint64) uint32 {
	if !x.tagged() {
		return e
	}
	return e | btag(fp, d)<<x.ibits
}

// growBlocks resizes the block slab to capacity n and rebuilds its table.
func (x *Index) growBlocks(n int) {
	blocks := make([]block, len(x.blocks), n)
	copy(blocks, x.blocks)
	x.blocks = blocks
	b := make([]uint64, len(x.bits), n*x.w)
	copy(b, x.bits)
	x.bits = b
	size := tableSize(n)
	x.btab = make([]uint32, size)
	x.bshift = uint(64 - bits.TrailingZeros(uint(size)))
	x.ibits = uint(bits.Len(uint(n)))
	x.bmask, x.fshift, x.fmask = ^uint32(0), 0, 0
	if x.ibits <= maxIdxBits {
		fbits := 32 - x.ibits - dispBits
		x.bmask = 1<<x.ibits - 1
		x.fshift, x.fmask = x.bshift-fbits, 1<<fbits-1
	}
	m := uint64(size - 1)
	for i := range x.blocks {
		if x.blocks[i].pairs == 0 {
			continue
		}
		h0, fp := x.bhash(x.blocks[i].key)
		d := uint64(0)
		for x.btab[(h0+d)&m] != 0 {
			d++
		}
		x.btab[(h0+d)&m] = x.bentry(uint32(i+1), fp, d)
	}
	x.accountBytes()
}

// growPairs resizes the pair slab to capacity n and rebuilds its table.
func (x *Index) growPairs(n int) {
	pairs := make([]pair, len(x.pairs), n)
	copy(pairs, x.pairs)
	x.pairs = pairs
	size := tableSize(n)
	x.ptab = make([]uint32, size)
	x.pshift = uint(64 - bits.TrailingZeros(uint(size)))
	m := uint64(size - 1)
	for i := range x.pairs {
		p := &x.pairs[i]
		if p.blk == 0 || x.blocks[p.blk-1].hint == uint32(i+1) {
			continue // free, or found through its block's hint
		}
		h := x.pslot(p.blk, p.slot)
		for x.ptab[h] != 0 {
			h = (h + 1) & m
		}
		x.ptab[h] = uint32(i + 1)
	}
	x.accountBytes()
}

// widen makes holder sets wide enough for slot s (write lock held).
func (x *Index) widen(s Slot) {
	if int(s) >= len(x.reps) {
		n := min(max(int(s)+1, 2*len(x.reps), 8), max(int(s)+1, MaxReplicas))
		reps := make([]holder, n)
		copy(reps, x.reps)
		x.reps = reps
		x.accountBytes()
	}
	w := int(s)/64 + 1
	if w <= x.w {
		return
	}
	b := make([]uint64, len(x.blocks)*w, cap(x.blocks)*w)
	for i := range x.blocks {
		copy(b[i*w:], x.bits[i*x.w:(i+1)*x.w])
	}
	x.bits, x.w = b, w
	x.accountBytes()
}

// fits reports whether growing by extra bytes stays within the budget.
func (x *Index) fits(extra int64) bool { return x.bytes.Load()+extra <= x.budget }

// blockGrowth is how far the block slab may grow now, 0 when not at all.
func (x *Index) blockGrowth() int {
	c := cap(x.blocks)
	for _, n := range [...]int{2 * c, c + c/2, c + c/4, c + c/8} {
		extra := int64(n-c)*(blockBytes+int64(x.w)*8) + int64(tableSize(n)-len(x.btab))*4
		if x.fits(extra) {
			return n
		}
	}
	return 0
}

// pairGrowth is how far the pair slab may grow now, 0 when not at all. A
// full index asks at every pair it adds: the answer 0 is kept until the
// slab or the bytes held change (pairStuck).
func (x *Index) pairGrowth() int {
	c := cap(x.pairs)
	b := x.bytes.Load()
	if x.pairStuck == [2]int64{int64(c), b} {
		return 0
	}
	for _, n := range [...]int{2 * c, c + c/2, c + c/4, c + c/8} {
		extra := int64(n-c)*pairBytes + int64(tableSize(n)-len(x.ptab))*4
		if x.fits(extra) {
			return n
		}
	}
	x.pairStuck = [2]int64{int64(c), b}
	return 0
}

// holders returns the holder set of key, nil when absent (read lock held).
// It is the lookup path: one probe loop, the set read in place.
func (x *Index) holders(key uint64) []uint64 {
	tab, slab := x.btab, x.blocks
	m := uint64(len(tab) - 1)
	h0, fp := x.bhash(key)
	tagged, ib := x.tagged(), x.ibits
	for d := uint64(0); ; d++ {
		v := tab[(h0+d)&m]
		if v == 0 {
			return nil
		}
		if tagged && v>>ib != btag(fp, d) {
			continue
		}
		if e := v & x.bmask; slab[e-1].key == key {
			if slab[e-1].pairs == ghost {
				return nil
			}
			i := int(e-1) * x.w
			return x.bits[i : i+x.w : i+x.w]
		}
	}
}

// holds reports whether slot s is believed to hold key.
func (x *Index) holds(key uint64, s Slot) bool {
	defer x.runlock(x.rlock())
	return hasBit(x.holders(key), s)
}

func hasBit(set []uint64, s Slot) bool {
	w := int(s) >> 6
	return w < len(set) && set[w]&(1<<(uint(s)&63)) != 0
}

// findBlock returns key's block, 0 when absent.
func (x *Index) findBlock(key uint64) uint32 {
	if _, e := x.findEntry(key); e != 0 && x.blocks[e-1].pairs != ghost {
		return e
	}
	return 0
}

// findEntry returns the table position of key and its block, a ghost or
// not (0 when absent: the position is then the empty slot where it would
// go).
func (x *Index) findEntry(key uint64) (uint64, uint32) {
	m := uint64(len(x.btab) - 1)
	h0, fp := x.bhash(key)
	tagged, ib := x.tagged(), x.ibits
	for d := uint64(0); ; d++ {
		h := (h0 + d) & m
		v := x.btab[h]
		if v == 0 {
			return h, 0
		}
		if tagged && v>>ib != btag(fp, d) {
			continue
		}
		if e := v & x.bmask; x.blocks[e-1].key == key {
			return h, e
		}
	}
}

// moved reports whether the last deletion in the block table (cut)
// changed a position of key's probe sequence up to h.
func (x *Index) moved(key uint64, h uint64) bool {
	m := uint64(len(x.btab) - 1)
	home := x.bslot(key)
	in := func(p, a, b uint64) bool { return (p-a)&m <= (b-a)&m }
	return in(x.cut[0], home, h) || in(home, x.cut[0], x.cut[1])
}

// entryOf returns the table position of block e, whose key is key.
func (x *Index) entryOf(key uint64, e uint32) uint64 {
	m := uint64(len(x.btab) - 1)
	for h := x.bslot(key); ; h = (h + 1) & m {
		if x.btab[h]&x.bmask == e {
			return h
		}
	}
}

// pairOf returns the pair (blk, s), 0 when s does not hold blk: the
// block's hint, else from the pair table (which holds every pair but the
// hints).
func (x *Index) pairOf(blk uint32, s Slot) uint32 {
	b := &x.blocks[blk-1]
	if e := b.hint; e != 0 {
		if x.pairs[e-1].slot == s {
			return e
		}
		if b.pairs == 1 {
			return 0 // its one pair is the hint
		}
	}
	_, e := x.findPair(blk, s)
	return e
}

func (x *Index) findPair(blk uint32, s Slot) (uint64, uint32) {
	m := uint64(len(x.ptab) - 1)
	for h := x.pslot(blk, s); ; h = (h + 1) & m {
		e := x.ptab[h]
		if e == 0 {
			return h, 0
		}
		if p := &x.pairs[e-1]; p.blk == blk && p.slot == s {
			return h, e
		}
	}
}

// removeAt deletes table position h with backward-shift deletion. disp
// gives the displacement from its home of the entry v met at position j;
// moved is entry v at its new displacement d.
// It returns the position it emptied: positions h to it changed.
func removeAt(tab []uint32, h uint64, disp func(v uint32, j uint64) uint64, moved func(v uint32, d uint64) uint32) uint64 {
	m := uint64(len(tab) - 1)
	i, j := h, h
	for {
		j = (j + 1) & m
		v := tab[j]
		if v == 0 {
			tab[i] = 0
			return i
		}
		// Leave v where it is if its home lies cyclically in (i, j].
		d, gap := disp(v, j), (j-i)&m
		if d < gap {
			continue
		}
		tab[i] = moved(v, d-gap)
		i = j
	}
}

// blockDisp is removeAt's disp for the block table: the entry's tag, else
// read from the slab.
func (x *Index) blockDisp(v uint32, j uint64) uint64 {
	if d := uint64(v>>x.ibits) & farDisp; x.tagged() && d != farDisp {
		return d
	}
	return (j - x.bslot(x.blocks[v&x.bmask-1].key)) & uint64(len(x.btab)-1)
}

// blockMoved is v at displacement d: its fingerprint stays.
func (x *Index) blockMoved(v uint32, d uint64) uint32 {
	if !x.tagged() {
		return v
	}
	return v&^(farDisp<<x.ibits) | uint32(min(d, farDisp))<<x.ibits
}

func (x *Index) pairDisp(e uint32, j uint64) uint64 {
	p := &x.pairs[e-1]
	return (j - x.pslot(p.blk, p.slot)) & uint64(len(x.ptab)-1)
}

func pairMoved(e uint32, _ uint64) uint32 { return e }

func (x *Index) unlinkBlock(e uint32) { x.unlinkFrom(&x.head, &x.tail, e) }

// unlinkFrom takes block e out of the list head..tail.
func (x *Index) unlinkFrom(head, tail *uint32, e uint32) {
	b := &x.blocks[e-1]
	x.joinFrom(head, tail, b.prev, b.next)
	b.prev, b.next = 0, 0
}

// joinFrom makes blocks prev and next neighbours in the list head..tail,
// cutting out what was between them (0: the list's end on that side).
func (x *Index) joinFrom(head, tail *uint32, prev, next uint32) {
	if prev != 0 {
		x.blocks[prev-1].next = next
	} else {
		*head = next
	}
	if next != 0 {
		x.blocks[next-1].prev = prev
	} else {
		*tail = prev
	}
}

// haunt makes block e, which no replica holds any more, a ghost: the
// newest of the ghost list.
func (x *Index) haunt(e uint32) {
	b := &x.blocks[e-1]
	b.pairs, b.hint = ghost, 0
	b.prev, b.next = x.gtail, 0
	if x.gtail != 0 {
		x.blocks[x.gtail-1].next = e
	} else {
		x.ghead = e
	}
	x.gtail = e
	x.ghosts++
}

// exorcise takes ghost e off the ghost list and out of the block table,
// a free entry.
func (x *Index) exorcise(e uint32) {
	x.unlinkFrom(&x.ghead, &x.gtail, e)
	x.ghosts--
	h := x.entryOf(x.blocks[e-1].key, e)
	x.cut = [2]uint64{h, removeAt(x.btab, h, x.blockDisp, x.blockMoved)}
	x.gone++
	x.blocks[e-1] = block{}
}

func (x *Index) pushBlock(e uint32) {
	b := &x.blocks[e-1]
	b.prev, b.next = 0, x.head
	if x.head != 0 {
		x.blocks[x.head-1].prev = e
	}
	x.head = e
	if x.tail == 0 {
		x.tail = e
	}
}

func (x *Index) unlinkPair(e uint32) {
	p := &x.pairs[e-1]
	r := &x.reps[p.slot]
	if p.prev != 0 {
		x.pairs[p.prev-1].next = p.next
	} else {
		r.head = p.next
	}
	if p.next != 0 {
		x.pairs[p.next-1].prev = p.prev
	} else {
		r.tail = p.prev
	}
	p.prev, p.next = 0, 0
}

func (x *Index) pushPair(e uint32) {
	p := &x.pairs[e-1]
	r := &x.reps[p.slot]
	p.prev, p.next = 0, r.head
	if r.head != 0 {
		x.pairs[r.head-1].prev = e
	}
	r.head = e
	if r.tail == 0 {
		r.tail = e
	}
}

// dropPair removes pair e: its replica no longer holds its block. The
// block goes when no replica holds it.
func (x *Index) dropPair(e uint32) {
	p := &x.pairs[e-1]
	blk, s := p.blk, p.slot
	x.unlinkPair(e)
	x.reps[s].blocks--
	b := &x.blocks[blk-1]
	if b.hint == e {
		b.hint = 0 // not in the pair table
	} else {
		h, _ := x.findPair(blk, s)
		removeAt(x.ptab, h, x.pairDisp, pairMoved)
	}
	x.bits[int(blk-1)*x.w+int(s)>>6] &^= 1 << (uint(s) & 63)
	*p = pair{links: links{next: x.pfree}}
	x.pfree = e
	x.n.pairs--
	if b.pairs--; b.pairs == 0 {
		x.unlinkBlock(blk)
		x.haunt(blk)
		x.n.entries--
	}
}

// evictBlock drops block e from every replica holding it.
func (x *Index) evictBlock(e uint32) {
	base := int(e-1) * x.w
	for wi := 0; wi < x.w; wi++ {
		for v := x.bits[base+wi]; v != 0; v &= v - 1 {
			s := Slot(wi*64 + bits.TrailingZeros64(v))
			if pe := x.pairOf(e, s); pe != 0 {
				x.dropPair(pe)
			}
		}
	}
}

// allocBlock returns a free block entry: a new one, else the newest
// ghost's, else it grows the slab or evicts the least recently used block
// (a ghost then) to make room.
func (x *Index) allocBlock() uint32 {
	for {
		if len(x.blocks) < cap(x.blocks) {
			x.blocks = append(x.blocks, block{})
			x.bits = x.bits[:len(x.blocks)*x.w]
			return uint32(len(x.blocks))
		}
		if e := x.gtail; e != 0 {
			x.exorcise(e)
			return e
		}
		if n := x.blockGrowth(); n > 0 {
			x.growBlocks(n)
			continue
		}
		x.evictBlock(x.tail)
		x.n.evictions++
	}
}

func (x *Index) allocPair() uint32 {
	for {
		if e := x.pfree; e != 0 {
			x.pfree = x.pairs[e-1].next
			x.pairs[e-1] = pair{}
			return e
		}
		if len(x.pairs) < cap(x.pairs) {
			x.pairs = append(x.pairs, pair{})
			return uint32(len(x.pairs))
		}
		if n := x.pairGrowth(); n > 0 {
			x.growPairs(n)
			continue
		}
		x.evictBlock(x.tail)
		x.n.evictions++
	}
}

// touch marks slot s as holding key and makes the pair the most recently
// used of the index and of s (write lock held). It reports whether s was
// not yet believed to hold key.
func (x *Index) touch(key uint64, s Slot) bool {
	h, e := x.findEntry(key)
	return x.touchEntry(key, s, h, e)
}

// touchEntry is touch of key, whose table position and block (a ghost or
// not) findEntry returned.
func (x *Index) touchEntry(key uint64, s Slot, h uint64, e uint32) bool {
	r := &x.reps[s]
	r.clock++
	if e != 0 && x.blocks[e-1].pairs != ghost {
		if x.head != e {
			x.unlinkBlock(e)
			x.pushBlock(e)
		}
		if hasBit(x.bits[int(e-1)*x.w:int(e)*x.w], s) {
			pe := x.pairOf(e, s)
			x.pairs[pe-1].stamp = r.clock
			if r.head != pe {
				x.unlinkPair(pe)
				x.pushPair(pe)
			}
			return false
		}
	}
	// Room first: making it may evict blocks (this one included: it is
	// then a ghost), and a new block's entry may take a ghost's (deleting
	// that from the table: h is then looked up again).
	gone, slab := x.gone, cap(x.blocks)
	pe := x.allocPair()
	switch {
	case e != 0 && x.blocks[e-1].pairs == ghost:
		// A ghost, or evicted while making room: a block again.
		x.unlinkFrom(&x.ghead, &x.gtail, e)
		x.ghosts--
		x.blocks[e-1].pairs = 0
		x.pushBlock(e)
		x.n.entries++
	case e == 0:
		e = x.allocBlock()
		if cap(x.blocks) != slab || x.gone != gone && x.moved(key, h) {
			// growBlocks rebuilt the table, or a deletion moved
			// entries where key is to go.
			h, _ = x.findEntry(key)
		}
		x.blocks[e-1].key = key
		clear(x.bits[int(e-1)*x.w : int(e)*x.w])
		home, fp := x.bhash(key)
		x.btab[h] = x.bentry(e, fp, (h-home)&uint64(len(x.btab)-1))
		x.pushBlock(e)
		x.n.entries++
	}
	b := &x.blocks[e-1]
	b.pairs++
	x.bits[int(e-1)*x.w+int(s)>>6] |= 1 << (uint(s) & 63)
	x.pairs[pe-1] = pair{blk: e, slot: s, stamp: r.clock}
	if b.hint == 0 {
		b.hint = pe // found through the block, not the pair table
	} else {
		ph, _ := x.findPair(e, s)
		x.ptab[ph] = pe
	}
	x.pushPair(pe)
	r.blocks++
	x.n.pairs++
	return true
}

// bound drops slot s's least recently used beliefs past its capacity and
// horizon (write lock held).
func (x *Index) bound(s Slot) {
	r := &x.reps[s]
	if r.capacity > 0 && r.blocks > r.capacity {
		x.dropTail(s, r.blocks-r.capacity, 0)
	}
	if r.horizon > 0 {
		x.dropTail(s, -1, r.horizon)
	}
}

// dropTail drops slot s's least recently used pairs, up to limit of them
// (-1: no limit) and, with a horizon, only those touched horizon or more
// touches ago, as dropPair of its list's tail would, one after the other.
// A pair that is its block's only one and its hint (a prompt sent to one
// replica: the run a learn past a horizon drops) is dropped in place: its
// list's tail cut, its block unlinked and made a ghost, without
// dropPair's lookups and branches (write lock held).
func (x *Index) dropTail(s Slot, limit, horizon int64) {
	r := &x.reps[s]
	bs, ps, set := x.blocks, x.pairs, x.bits
	w, word, bit := x.w, int(s)>>6, uint64(1)<<(uint(s)&63)
	tail, free, gtail := r.tail, x.pfree, x.gtail
	k := int64(0) // dropped in place
	for n := int64(0); n != limit && tail != 0; n++ {
		pe := tail
		p := &ps[pe-1]
		if horizon > 0 && r.clock-p.stamp < horizon {
			break
		}
		if n%warmRun == 0 && r.blocks >= minWarm {
			x.warmTail(tail, limit-n, r.clock, horizon)
		}
		blk := p.blk
		b := &bs[blk-1]
		if b.hint != pe || b.pairs != 1 {
			r.tail, x.pfree, x.gtail = tail, free, gtail
			x.settleDrops(r, k)
			k = 0
			x.dropPair(pe)
			x.n.dropped++
			tail, free, gtail = r.tail, x.pfree, x.gtail
			continue
		}
		k++
		if tail = p.prev; tail != 0 {
			ps[tail-1].next = 0
		} else {
			r.head = 0
		}
		*p = pair{links: links{next: free}}
		free = pe
		set[int(blk-1)*w+word] &^= bit
		// Out of the global list, onto the ghost list (haunt).
		x.joinFrom(&x.head, &x.tail, b.prev, b.next)
		b.pairs, b.hint = ghost, 0
		b.prev, b.next = gtail, 0
		if gtail != 0 {
			bs[gtail-1].next = blk
		} else {
			x.ghead = blk
		}
		gtail = blk
	}
	r.tail, x.pfree, x.gtail = tail, free, gtail
	x.settleDrops(r, k)
}

// settleDrops counts k pairs of r that dropTail dropped in place, each
// its block's last: k ghosts more.
func (x *Index) settleDrops(r *holder, k int64) {
	r.blocks -= k
	x.n.pairs -= k
	x.n.entries -= k
	x.n.dropped += uint64(k)
	x.ghosts += int(k)
}

// warmTail loads the blocks of the warmRun least recent pairs of a
// replica's list, from its tail on: the next ones bound drops, as warm
// does for touch. (A dropped block stays in the table, a ghost: its table
// entry is not needed.) It stops where dropTail will: after left pairs
// (negative: no limit), or at the first pair touched less than horizon
// (when positive) touches before clock, the replica's.
func (x *Index) warmTail(tail uint32, left, clock, horizon int64) {
	acc := int32(0)
	n := int64(0)
	for e := tail; e != 0 && n < warmRun && n != left; e = x.pairs[e-1].prev {
		p := &x.pairs[e-1]
		if horizon > 0 && clock-p.stamp < horizon {
			break
		}
		acc += x.blocks[p.blk-1].pairs
		n++
	}
	x.warmSink = uint32(acc)
}

// Learn records that slot s now holds every block of blocks. Blocks are
// touched from last to first so that a prefix's head stays the most recent.
func (x *Index) Learn(blocks []uint64, s Slot) {
	x.learn(blocks, s, 0)
}

// learn is Learn that first reads the age (touches of s since) of the
// pair (blocks[probe-1], s), -1 when absent or probe is 0.
func (x *Index) learn(blocks []uint64, s Slot, probe int) int64 {
	return x.learnTo(blocks, s, probe, -1, nil)
}

// learnTo is learn that leaves s's clock after it in t (when not nil);
// held is learnLocked's.
func (x *Index) learnTo(blocks []uint64, s Slot, probe, held int, t *learnTicket) int64 {
	if len(blocks) == 0 || s < 0 {
		return -1
	}
	x.lock()
	defer x.unlock()
	age := x.learnLocked(blocks, s, probe, held)
	if t != nil {
		t.clock.Store(x.reps[s].clock)
	}
	return age
}

// clockOf is how many blocks were touched for slot s (its LRU list's
// clock, in which ages and horizons count).
func (x *Index) clockOf(s Slot) int64 {
	defer x.runlock(x.rlock())
	if int(s) >= len(x.reps) || s < 0 {
		return 0
	}
	return x.reps[s].clock
}

// learnLocked is learn with the write lock held. held is how many leading
// blocks s held when the caller last read the index (Pick's depths;
// negative: not known): below minRun no run is sought. It is a hint: a
// run missed for it (s learned more since) is touched block by block, to
// the same effect.
func (x *Index) learnLocked(blocks []uint64, s Slot, probe, held int) int64 {
	if len(blocks) == 0 || s < 0 {
		return -1
	}
	x.widen(s)
	if age, ok := x.ghostTail(blocks, s, probe); ok {
		return age // the whole learn: bound has nothing to drop
	}
	age := int64(-1)
	if probe > 0 && probe <= len(blocks) {
		if e := x.findBlock(blocks[probe-1]); e != 0 {
			if pe := x.pairOf(e, s); pe != 0 {
				age = x.reps[s].clock - x.pairs[pe-1].stamp
			}
		}
	}
	blocks = blocks[:x.dropAhead(blocks, s)]
	// A prompt sent to s before (a resent or extended conversation) is
	// often a run of consecutive pairs of s's list already, in the order
	// the touches would leave it: those are moved as one (touchRun).
	run := 0
	if len(blocks) >= minRun && (held < 0 || held >= minRun) {
		if run, _, _ = x.runOf(blocks, s); run < minRun {
			run = 0
		}
	}
	x.touchEach(blocks[run:], s)
	if run > 0 {
		// The touches of the rest may have moved or evicted pairs of the
		// run: look again.
		if m, first, last := x.runOf(blocks[:run], s); m == run {
			x.touchRun(s, first, last, run)
		} else {
			x.touchEach(blocks[:run], s)
		}
	}
	x.bound(s)
	return age
}

// minAhead is the fewest blocks dropAhead skips.
const minAhead = 32

// keep is how many of n blocks of a prompt the holder keeps: n bounded by
// its horizon and its capacity (each 0: unbounded).
func (r *holder) keep(n int) int {
	if r.horizon > 0 && r.horizon < int64(n) {
		n = int(r.horizon)
	}
	if r.capacity > 0 && r.capacity < int64(n) {
		n = int(r.capacity)
	}
	return n
}

// dropAhead does at once what learning blocks on s would do to the blocks
// that s's own bound drops at the end of that learn, and returns how many
// leading blocks are left to learn (all when it did nothing). After the
// touches s's list begins with blocks in order, their ages 0 to n-1, and
// its older pairs are all older than n: the capacity keeps at most its
// own number of them, the horizon (when not past n) its own number, and
// the older pairs go first. So blocks[keep:] are touched and dropped at
// once, and what remains of that is: the clock advanced; a block another
// replica holds moved to the front of the global list (in the touches'
// order); s's own old pair of a block dropped; a drop counted for each.
// The rest (their insertion and removal) is skipped. It applies only when
// no block repeats (a chained prompt's never do; the ages above assume
// it) and when the touches would have found room without growing a slab
// or evicting (the skipped insertions could have forced either), both
// checked in a first pass of lookups (write lock held).
func (x *Index) dropAhead(blocks []uint64, s Slot) int {
	r := &x.reps[s]
	n := len(blocks)
	keep := r.keep(n)
	if n-keep < minAhead {
		return n
	}
	ents := x.ahead[:0]
	needBlocks, needPairs := 0, 0
	set := x.aheadSet(n)
	m := uint64(len(set) - 1)
	zero := false
	for _, k := range blocks {
		// A repeated block: the full path.
		if k == 0 {
			if zero {
				return n
			}
			zero = true
		} else {
			h := mix64(k) & m
			for set[h] != 0 && set[h] != k {
				h = (h + 1) & m
			}
			if set[h] == k {
				return n
			}
			set[h] = k
		}
		_, e := x.findEntry(k)
		switch {
		case e == 0 || x.blocks[e-1].pairs == ghost:
			needBlocks++
			needPairs++
		case !hasBit(x.bits[int(e-1)*x.w:int(e)*x.w], s):
			needPairs++
		}
		ents = append(ents, e)
	}
	x.ahead = ents
	if needBlocks > cap(x.blocks)-len(x.blocks)+x.ghosts || int64(needPairs) > int64(cap(x.pairs))-x.n.pairs {
		return n
	}
	r.clock += int64(n - keep)
	for i := n - 1; i >= keep; i-- {
		x.n.dropped++
		e := ents[i]
		if e == 0 || x.blocks[e-1].pairs == ghost {
			continue
		}
		if x.head != e {
			x.unlinkBlock(e)
			x.pushBlock(e)
		}
		if pe := x.pairOf(e, s); pe != 0 {
			x.dropPair(pe)
		}
	}
	return keep
}

// ghostTail is the learn (learnLocked, probe's age and all, write lock
// held) of a prompt resent to s past its horizon or capacity, fewer than
// minAhead blocks past it (dropAhead's keep): when the blocks the learn
// would drop at its end, blocks[keep:], are the newest ghosts,
// blocks[keep] the newest, s holds blocks[:keep] and nothing else, in
// order from its list's head, and the pair free list has an entry for
// each, the full path would revive them (one run, neither growing nor
// evicting) and drop them again, leaving the ghost list, the block table,
// the global list and the pairs as they are. It then does what remains of
// that, and reports so (ok) with the probe's age: s's clock advanced past
// the dropped blocks, a drop counted for each, the free list's first
// entries in the order the drops leave them (reversed), and blocks[:keep],
// s's whole list, touched as one run (touchRun), which bound keeps.
func (x *Index) ghostTail(blocks []uint64, s Slot, probe int) (age int64, ok bool) {
	r := &x.reps[s]
	n := len(blocks)
	keep := r.keep(n)
	if keep == n || n-keep >= minAhead || keep == 0 || r.blocks != int64(keep) || x.noTail {
		return -1, false
	}
	bs, ps := x.blocks, x.pairs
	g := x.gtail
	for _, k := range blocks[keep:] {
		if g == 0 || bs[g-1].key != k {
			return -1, false
		}
		g = bs[g-1].prev
	}
	age = -1 // the probe's block past keep: a ghost, not held
	p, last := r.head, uint32(0)
	for j, k := range blocks[:keep] {
		if p == 0 || bs[ps[p-1].blk-1].key != k {
			return -1, false
		}
		if j == probe-1 {
			age = r.clock - ps[p-1].stamp
		}
		p, last = ps[p-1].next, p
	}
	m := n - keep
	f := x.pfree
	for range m {
		if f == 0 {
			return -1, false
		}
		f = ps[f-1].next
	}
	prev, cur := f, x.pfree // the first m entries reversed, the rest (from f) after them
	for range m {
		next := ps[cur-1].next
		ps[cur-1].next, prev, cur = prev, cur, next
	}
	x.pfree = prev
	r.clock += int64(m)
	x.n.dropped += uint64(m)
	x.touchRun(s, r.head, last, keep) // s's whole list, blocks[:keep] in order: one run
	return age, true
}

// aheadSet returns dropAhead's cleared set of keys for n blocks.
func (x *Index) aheadSet(n int) []uint64 {
	size := tableSize(n)
	if cap(x.aheadKeys) < size {
		x.aheadKeys = make([]uint64, size)
	}
	set := x.aheadKeys[:size]
	clear(set)
	return set
}

// Replied charges slot s with n blocks of a reply: the blocks the engine
// caches beyond the prompt's fingerprinted ones once it has answered (its
// output's full blocks, as vLLM caches a sequence's generated blocks and
// SGLang's cache_finished_req inserts the input and output ids), which
// take room in its KV cache as the prompt's do. They are n entries keyed
// off the prompt's last block (tail) that no prompt holds: they count
// against s's capacity and age in its LRU list like a prompt's blocks, so
// the index presumes evicted what the engine evicts to hold replies. When
// the next turn of a conversation extends the prompt on s and the engine
// reports that it reused the reply, its own blocks cover the reply:
// Router.Observe drops these.
func (x *Index) Replied(tail uint64, s Slot, n int) {
	if n <= 0 || s < 0 {
		return
	}
	x.lock()
	defer x.unlock()
	x.widen(s)
	if c := x.reps[s].capacity; c > 0 {
		n = int(min(int64(n), c))
	}
	// The engine releases a finished sequence's blocks deepest first, so
	// its reply's are the first of them it evicts: they go right behind
	// the prompt's last block in s's list (at its tail when s no longer
	// holds it), stamped as it is, the first reply block nearest.
	anchor := uint32(0)
	if e := x.findBlock(tail); e != 0 {
		anchor = x.pairOf(e, s)
	}
	r := &x.reps[s]
	for k := 0; k < n; k++ {
		i := k
		if anchor != 0 {
			i = n - 1 - k
		}
		x.touch(replyKey(tail, i), s)
		pe := r.head
		at, stamp := anchor, int64(0)
		if at == 0 {
			at = r.tail
		}
		if at == pe {
			continue // the list's only pair
		}
		if at != 0 {
			stamp = x.pairs[at-1].stamp
		}
		x.unlinkPair(pe)
		p, a := &x.pairs[pe-1], &x.pairs[at-1]
		p.stamp, p.prev, p.next = stamp, at, a.next
		if a.next != 0 {
			x.pairs[a.next-1].prev = pe
		} else {
			r.tail = pe
		}
		a.next = pe
	}
	x.bound(s)
}

// replyKey is the key of the i-th block of the reply to the prompt whose
// last block is tail (Replied).
func replyKey(tail uint64, i int) uint64 { return mix64(tail^0x5bd1e9955bd1e995) + uint64(i) }

// dropReply drops s's reply blocks keyed off tail (Replied).
func (x *Index) dropReply(tail uint64, s Slot) {
	if s < 0 {
		return
	}
	x.lock()
	defer x.unlock()
	for i := 0; ; i++ {
		e := x.findBlock(replyKey(tail, i))
		if e == 0 {
			return
		}
		pe := x.pairOf(e, s)
		if pe == 0 {
			return
		}
		x.dropPair(pe)
	}
}

// minRun is the shortest run of blocks learn moves as one.
const minRun = 4

// touchEach touches blocks from last to first (write lock held).
//
// A prompt whose blocks were dropped together (by a horizon or capacity,
// its last block first) finds them in a row on the ghost list, each the
// ghost after the next block's: each is taken from there, its key
// compared, without a lookup in the block table.
//
// Such a row is taken back in one step (reviveRun).
func (x *Index) touchEach(blocks []uint64, s Slot) {
	warmed := len(blocks)
	after := uint32(0) // the ghost after the last one touched
	for i := len(blocks) - 1; i >= 0; i-- {
		key := blocks[i]
		if g := after; g != 0 && x.blocks[g-1].key == key && x.blocks[g-1].pairs == ghost {
			if m, next := x.reviveRun(blocks[:i+1], s, g); m > 0 {
				i -= m - 1
				after = next
				continue
			}
			after = x.blocks[g-1].next
			x.touchEntry(key, s, 0, g)
			continue
		}
		if i < warmed {
			if warmed = max(0, i+1-warmRun); i+1-warmed >= minWarm {
				x.warm(blocks[warmed : i+1])
			}
		}
		h, e := x.findEntry(key)
		after = 0
		if e != 0 && x.blocks[e-1].pairs == ghost {
			if m, next := x.reviveRun(blocks[:i+1], s, e); m > 0 {
				i -= m - 1
				after = next
				continue
			}
			after = x.blocks[e-1].next
		}
		x.touchEntry(key, s, h, e)
	}
}

// reviveRun is touchEntry of the ghosts g, g's next on the ghost list, its
// next, ... as long as their keys are those of blocks from the last one
// back, done as one step: each block pushed to the global list and given a
// pair of s, pushed to s's list, as touchEntry would (the same entries,
// orders, stamps and counts) without its checks per block, and the run
// cut out of the ghost list at once. It takes no more ghosts than the pair
// slab has room for (so that no pair allocation could evict or grow it),
// and returns how many it took (0: none) and the ghost after the run
// (write lock held). The keys of a run are distinct: a list holds an
// entry once.
func (x *Index) reviveRun(blocks []uint64, s Slot, g uint32) (int, uint32) {
	nb := len(blocks)
	n := int64(nb)
	if room := int64(cap(x.pairs)) - x.n.pairs; room < n {
		n = room
	}
	if n <= 0 {
		return 0, 0
	}
	r := &x.reps[s]
	bs, ps, set, w := x.blocks, x.pairs, x.bits, x.w
	word, bit := int(s)>>6, uint64(1)<<(uint(s)&63)
	head, phead, free, clock := x.head, r.head, x.pfree, r.clock
	before := bs[g-1].prev
	e, m := g, int64(0)
	for {
		b := &bs[e-1]
		next := b.next // the ghost touched after this one
		// A pair: the free list's first, else a new entry (room was
		// checked: allocPair would neither grow nor evict).
		pe := free
		if pe != 0 {
			free = ps[pe-1].next
		} else {
			ps = append(ps, pair{})
			pe = uint32(len(ps))
		}
		clock++
		ps[pe-1] = pair{blk: e, slot: s, links: links{next: phead}, stamp: clock}
		if phead != 0 {
			ps[phead-1].prev = pe
		} else {
			r.tail = pe
		}
		phead = pe
		b.pairs, b.hint = 1, pe
		b.prev, b.next = 0, head
		if head != 0 {
			bs[head-1].prev = e
		} else {
			x.tail = e
		}
		head = e
		set[int(e-1)*w+word] |= bit
		m++
		e = next
		if m == n || e == 0 || bs[e-1].key != blocks[nb-1-int(m)] {
			break
		}
	}
	// Cut the run out of the ghost list: before and e are its neighbours.
	x.joinFrom(&x.ghead, &x.gtail, before, e)
	x.ghosts -= int(m)
	x.pairs, x.pfree = ps, free
	x.head, r.head, r.clock = head, phead, clock
	r.blocks += m
	x.n.entries += m
	x.n.pairs += m
	return int(m), e
}

// runOf returns how many leading blocks of blocks s holds as consecutive
// pairs of its LRU list, blocks[0]'s nearest the head, and the first and
// last of those pairs (0 when s does not hold blocks[0]).
func (x *Index) runOf(blocks []uint64, s Slot) (n int, first, last uint32) {
	if len(blocks) == 0 {
		return 0, 0, 0
	}
	e := x.findBlock(blocks[0])
	if e == 0 {
		return 0, 0, 0
	}
	first = x.pairOf(e, s)
	if first == 0 {
		return 0, 0, 0
	}
	last, n = first, 1
	for n < len(blocks) {
		q := x.pairs[last-1].next
		if q == 0 || x.blocks[x.pairs[q-1].blk-1].key != blocks[n] {
			break
		}
		last = q
		n++
	}
	return n, first, last
}

// touchRun is touch of the n blocks of the run of s's pairs first..last
// (runOf), from last to first, done as one move: the pairs get the stamps
// the touches would give them and go to the head of s's list in one
// splice; their blocks go to the head of the global list in one splice
// when they are consecutive there too, else one by one, without a lookup
// (write lock held).
func (x *Index) touchRun(s Slot, first, last uint32, n int) {
	r := &x.reps[s]
	c := r.clock
	r.clock += int64(n)
	// Stamps, and whether the blocks are consecutive in the global list.
	inOrder := true
	prevBlk := uint32(0)
	i := 0
	for p := first; ; p = x.pairs[p-1].next {
		pp := &x.pairs[p-1]
		pp.stamp = c + int64(n-i)
		if prevBlk != 0 && x.blocks[prevBlk-1].next != pp.blk {
			inOrder = false
		}
		prevBlk = pp.blk
		i++
		if p == last {
			break
		}
	}
	// The global list.
	b0, bl := x.pairs[first-1].blk, x.pairs[last-1].blk
	switch {
	case inOrder:
		spliceFront(x.blockLinks, &x.head, &x.tail, b0, bl)
	default:
		for p := last; ; p = x.pairs[p-1].prev {
			if e := x.pairs[p-1].blk; x.head != e {
				x.unlinkBlock(e)
				x.pushBlock(e)
			}
			if p == first {
				break
			}
		}
	}
	spliceFront(x.pairLinks, &r.head, &r.tail, first, last)
}

// warmRun is how many blocks learn looks up ahead of touching them.
const warmRun = 32

// minWarm is the fewest blocks warm and warmTail load ahead: fewer are not
// worth a pass of their own (Pick's depths had just read most of a short
// prompt's entries; a short list's pairs are a few lines), and the lookups
// that follow read them anyway. Loads only: no belief depends on it.
const minWarm = 8

// warm loads the block-table entries of keys and the blocks they find,
// ahead of touch: the lookups do not depend on each other, so the
// processor overlaps their cache misses, where touch's chain of lookups
// and list updates would wait for each in turn.
func (x *Index) warm(keys []uint64) {
	tab, slab := x.btab, x.blocks
	tagged, ib := x.tagged(), x.ibits
	acc := uint32(0)
	for _, k := range keys {
		h, fp := x.bhash(k)
		v := tab[h]
		if tagged && v>>ib != btag(fp, 0) {
			acc += v // not k's block: only the table's line is needed
			continue
		}
		if e := v & x.bmask; e != 0 && int(e) <= len(slab) {
			acc += slab[e-1].hint
		}
	}
	x.warmSink = acc
}

// Forget drops every belief about slot s: the replica is treated as cold.
// Its capacity and horizon stay.
func (x *Index) Forget(s Slot) {
	x.lock()
	defer x.unlock()
	x.forget(s)
}

func (x *Index) forget(s Slot) {
	if int(s) >= len(x.reps) || s < 0 {
		return
	}
	for r := &x.reps[s]; r.head != 0; {
		x.dropPair(r.head)
	}
}

// release forgets slot s and clears its settings: the slot is free for a
// new replica.
func (x *Index) release(s Slot) {
	x.lock()
	defer x.unlock()
	x.forget(s)
	if int(s) < len(x.reps) && s >= 0 {
		x.reps[s] = holder{}
	}
}

// SetCapacity bounds what slot s is believed to hold to blocks blocks
// (0: unbounded), dropping its least recently used beliefs past it.
func (x *Index) SetCapacity(s Slot, blocks int64) {
	if s < 0 {
		return
	}
	x.lock()
	defer x.unlock()
	x.widen(s)
	x.reps[s].capacity = max(0, blocks)
	x.bound(s)
}

// Capacity is slot s's capacity in blocks (0: unbounded).
func (x *Index) Capacity(s Slot) int64 {
	defer x.runlock(x.rlock())
	if int(s) >= len(x.reps) || s < 0 {
		return 0
	}
	return x.reps[s].capacity
}

// SetHorizon drops slot s's beliefs once blocks more blocks were touched
// for it since (0: never), dropping the ones already past it.
func (x *Index) SetHorizon(s Slot, blocks int64) {
	if s < 0 {
		return
	}
	x.lock()
	defer x.unlock()
	x.widen(s)
	x.reps[s].horizon = max(0, blocks)
	x.bound(s)
}

// Horizon is slot s's horizon in blocks (0: none).
func (x *Index) Horizon(s Slot) int64 {
	defer x.runlock(x.rlock())
	if int(s) >= len(x.reps) || s < 0 {
		return 0
	}
	return x.reps[s].horizon
}

// Held is how many blocks slot s is believed to hold.
func (x *Index) Held(s Slot) int64 {
	defer x.runlock(x.rlock())
	if int(s) >= len(x.reps) || s < 0 {
		return 0
	}
	return x.reps[s].blocks
}

// Depths sets depth[s] for every slot s in interest to the number of
// leading blocks of blocks that s is believed to hold. Slots outside
// interest are left untouched.
func (x *Index) Depths(blocks []uint64, interest SlotSet, depth *[MaxReplicas]int32) {
	var w depthWork
	x.depths(blocks, interest[:], depth[:], &w)
}

// span is an open interval of the bisection: its slots (mask m of the
// level's arena) hold block lo and not block hi, so their boundary lies
// inside. The spans of a level hold disjoint slots.
type span struct{ lo, hi int32 }

// depthWork is the bisection's working memory, kept in Scratch so that a
// decision allocates nothing once it has grown to the fleet.
type depthWork struct {
	spans [2][]span
	masks [2][]uint64
	m0    []uint64
}

func grow64(b []uint64, n int) []uint64 {
	if cap(b) < n {
		return make([]uint64, n, n+n/2)
	}
	return b[:n]
}

// depths is Depths over an interest set of any width.
//
// The bisection runs breadth first: every open interval of a level is
// probed before any is split, so the level's index lookups are independent
// of each other and the processor overlaps their memory accesses (a depth
// first bisection chains every lookup on the previous one).
func (x *Index) depths(blocks []uint64, interest []uint64, depth []int32, wk *depthWork) {
	n := len(blocks)
	if n == 0 {
		return
	}
	defer x.runlock(x.rlock())
	W := min(x.w, len(interest))
	h0 := x.holders(blocks[0])
	if h0 == nil {
		return
	}
	m0 := grow64(wk.m0, W)
	wk.m0 = m0
	any := uint64(0)
	for i := range m0 {
		m0[i] = h0[i] & interest[i]
		any |= m0[i]
	}
	if any == 0 {
		return
	}
	// Slots holding the last block hold the whole prompt.
	var hN []uint64
	if n > 1 {
		hN = x.holders(blocks[n-1])
	}
	if W == 1 && n <= shortDepths {
		// One word of slots, a short prompt: the same probes, depth
		// first over a mask in a register.
		full := m0[0]
		if n > 1 {
			full = 0
			if hN != nil {
				full = m0[0] & hN[0]
			}
		}
		setDepthWord(full, 0, int32(n), depth)
		if rest := m0[0] &^ full; rest != 0 {
			x.bisect1(blocks, 0, int32(n-1), rest, depth)
		}
		return
	}
	cur := grow64(wk.masks[0], W)
	open := 0
	rest := uint64(0)
	for i := range m0 {
		full := m0[i]
		if n > 1 {
			full = 0
			if hN != nil {
				full = m0[i] & hN[i]
			}
		}
		setDepthWord(full, i, int32(n), depth)
		cur[i] = m0[i] &^ full
		rest |= cur[i]
	}
	spans := wk.spans[0][:0]
	if rest != 0 {
		spans = append(spans, span{0, int32(n - 1)})
		open = 1
	}
	nextSpans, next := wk.spans[1][:0], wk.masks[1]
	for open > 0 {
		nextSpans = nextSpans[:0]
		next = grow64(next, 2*open*W)[:0]
		for k := 0; k < open; k++ {
			sp := spans[k]
			m := cur[k*W : (k+1)*W]
			if sp.hi-sp.lo <= 1 {
				for i, v := range m {
					setDepthWord(v, i, sp.lo+1, depth)
				}
				continue
			}
			mid := sp.lo + (sp.hi-sp.lo)/2
			hm := x.holders(blocks[mid])
			left, right := uint64(0), uint64(0)
			base := len(next)
			next = next[:base+2*W]
			l, r := next[base:base+W], next[base+W:base+2*W]
			for i, v := range m {
				in := uint64(0)
				if hm != nil {
					in = v & hm[i]
				}
				l[i], r[i] = v&^in, in
				left |= l[i]
				right |= r[i]
			}
			switch {
			case left != 0 && right != 0:
				nextSpans = append(nextSpans, span{sp.lo, mid}, span{mid, sp.hi})
			case left != 0:
				nextSpans = append(nextSpans, span{sp.lo, mid})
				next = next[:base+W]
			default:
				nextSpans = append(nextSpans, span{mid, sp.hi})
				copy(l, r)
				next = next[:base+W]
			}
		}
		spans, nextSpans = nextSpans, spans
		cur, next = next, cur
		open = len(spans)
	}
	wk.spans[0], wk.spans[1] = spans[:0], nextSpans[:0]
	wk.masks[0], wk.masks[1] = cur[:0], next[:0]
}

// shortDepths is the longest prompt (in blocks) whose bisection over one
// word of slots runs depth first (bisect1): a few probes, whose memory
// accesses the breadth-first form overlaps for long prompts.
const shortDepths = 64

// bisect1 is depths' bisection of the span (lo, hi) for the slots of m,
// all in the first word of a set (read lock held): the probes and the
// outcome of the breadth-first form, one span after the other.
func (x *Index) bisect1(blocks []uint64, lo, hi int32, m uint64, depth []int32) {
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		in := uint64(0)
		if hm := x.holders(blocks[mid]); hm != nil {
			in = m & hm[0]
		}
		switch left := m &^ in; {
		case left != 0 && in != 0:
			x.bisect1(blocks, lo, mid, left, depth)
			lo, m = mid, in
		case left != 0:
			hi = mid
		default:
			lo = mid
		}
	}
	setDepthWord(m, 0, lo+1, depth)
}

// setDepthWord sets depth[s] = d for every slot s of word i of a set.
func setDepthWord(v uint64, i int, d int32, depth []int32) {
	for ; v != 0; v &= v - 1 {
		depth[i*64+bits.TrailingZeros64(v)] = d
	}
}
