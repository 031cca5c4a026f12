package engine

import (
	"encoding/binary"
	"time"

	"github.com/cespare/xxhash/v2"
)

// KVEventKind is the kind of a KV cache event, as vLLM publishes them.
type KVEventKind uint8

const (
	// BlockStored: full blocks were computed and entered the prefix cache.
	BlockStored KVEventKind = iota + 1
	// BlockRemoved: cached blocks were evicted.
	BlockRemoved
	// AllBlocksCleared: the whole prefix cache was dropped (Reset).
	AllBlocksCleared
)

func (k KVEventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// KVEvent is one change of the prefix cache. Slices are owned by the
// receiver.
type KVEvent struct {
	Kind KVEventKind
	// At is the simulated time of the change.
	At time.Duration
	// BlockHashes are the chained hashes of the stored or removed blocks,
	// in chain order for BlockStored.
	BlockHashes []uint64
	// ParentHash is the hash of the block before the first stored one;
	// HasParent is false when the first stored block starts the sequence.
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the tokens of all stored blocks, concatenated
	// (len = len(BlockHashes) x BlockSize).
	TokenIDs []uint32
	// BlockSize is the number of tokens per block (BlockStored only).
	BlockSize int
}

// HashBlock is the engine's chained block hash: xxhash64 over the seed,
// the parent hash (0 for the first block) and the tokens as 4-byte
// little-endian integers. It is the simulator's own hash, as vLLM's is its
// own; routers must map it to their keys through the events' token ids.
func HashBlock(seed, parent uint64, tokens []uint32) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], seed)
	binary.LittleEndian.PutUint64(b[8:], parent)
	_, _ = d.Write(b[:])
	var t [64]byte
	for len(tokens) > 0 {
		n := min(len(tokens), len(t)/4)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(t[4*i:], tokens[i])
		}
		_, _ = d.Write(t[:4*n])
		tokens = tokens[n:]
	}
	return d.Sum64()
}

// block is one cached (hashed) KV block. Private, not-yet-full blocks of a
// sequence are not represented (a nil entry in seq.blocks).
type block struct {
	hash       uint64
	refs       int32
	prev, next *block // free LRU list while refs == 0
}

// prefixCache tracks block occupancy and the set of cached blocks.
//
// Physical blocks are: used (referenced by sequences, cached or private),
// lru (cached, unreferenced, evictable, oldest first) and free (never
// cached or already evicted). used + lruLen + free = total.
type prefixCache struct {
	total  int
	used   int
	lruLen int
	head   *block // oldest
	tail   *block
	cached blockTable
	spare  *block // evicted blocks for reuse, linked through next
}

func newPrefixCache(total int) *prefixCache {
	return &prefixCache{total: total}
}

// newBlock returns a cached block of hash h with one reference, reusing
// an evicted one when there is one.
func (c *prefixCache) newBlock(h uint64) *block {
	b := c.spare
	if b == nil {
		return &block{hash: h, refs: 1}
	}
	c.spare = b.next
	*b = block{hash: h, refs: 1}
	return b
}

func (c *prefixCache) free() int { return c.total - c.used - c.lruLen }

func (c *prefixCache) lruRemove(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		c.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next = nil, nil
	c.lruLen--
}

func (c *prefixCache) lruPush(b *block) {
	b.prev, b.next = c.tail, nil
	if c.tail != nil {
		c.tail.next = b
	} else {
		c.head = b
	}
	c.tail = b
	c.lruLen++
}

// ref takes a reference on a cached block.
func (c *prefixCache) ref(b *block) {
	if b.refs == 0 {
		c.lruRemove(b)
		c.used++
	}
	b.refs++
}

// unref drops a reference; an unreferenced block goes to the LRU tail.
func (c *prefixCache) unref(b *block) {
	b.refs--
	if b.refs == 0 {
		c.used--
		c.lruPush(b)
	}
}

// canAlloc reports whether n new blocks fit after evicting cached ones.
func (c *prefixCache) canAlloc(n int) bool { return c.free()+c.lruLen >= n }

// alloc takes n private blocks, evicting LRU blocks as needed and appending
// their hashes to removed. The caller checked canAlloc.
func (c *prefixCache) alloc(n int, removed []uint64) []uint64 {
	for c.free() < n && c.head != nil {
		b := c.head
		c.lruRemove(b)
		c.cached.del(b.hash)
		removed = append(removed, b.hash)
		// Unreferenced (it was in the LRU list): no sequence holds it.
		b.next, c.spare = c.spare, b
	}
	c.used += n
	return removed
}

// clear drops every cached block; sequences must hold none.
func (c *prefixCache) clear() {
	c.cached.reset()
	c.head, c.tail, c.lruLen = nil, nil, 0
}
