package engine

// blockTable maps a block's chain hash to its cached block: an
// open-addressing table with linear probing and backward-shift deletion
// (no tombstones), kept at most half full. The prefix cache inserts and
// evicts blocks all the time once it is full; Go's map degrades under that
// churn (lookups of absent hashes, the common case when a block is
// computed, probe past deleted slots), and the fleet simulation spends
// most of its time there at 256 replicas. The table holds at most the
// engine's total blocks, so it is bounded by 2 x the next power of two of
// TotalBlocks slots.
type blockTable struct {
	keys []uint64
	vals []*block // nil: empty slot
	n    int
	mask uint64
}

// blockTableMin is a table's first size. Tables grow by doubling: sizing
// them for the whole cache up front cost more (zeroing and scanning 512
// KiB per replica at 256 replicas, most of them far from full) than the
// rehashes it saved.
const blockTableMin = 64

// slot is the home slot of h. Chain hashes are xxhash outputs; the
// multiplication spreads any regularity of other callers' keys as well.
func (t *blockTable) slot(h uint64) uint64 { return (h * 0x9e3779b97f4a7c15) >> 32 & t.mask }

// len is the number of cached blocks.
func (t *blockTable) len() int { return t.n }

// get returns the block of hash h, or nil.
func (t *blockTable) get(h uint64) *block {
	if t.n == 0 {
		return nil
	}
	for i := t.slot(h); ; i = (i + 1) & t.mask {
		b := t.vals[i]
		if b == nil {
			return nil
		}
		if t.keys[i] == h {
			return b
		}
	}
}

// put sets h's block to b (b non-nil).
func (t *blockTable) put(h uint64, b *block) {
	if 2*(t.n+1) > len(t.vals) {
		t.grow()
	}
	for i := t.slot(h); ; i = (i + 1) & t.mask {
		if t.vals[i] == nil {
			t.keys[i], t.vals[i] = h, b
			t.n++
			return
		}
		if t.keys[i] == h {
			t.vals[i] = b
			return
		}
	}
}

// del removes h, shifting back the entries of its probe run so that no
// lookup ever has to step over a hole.
func (t *blockTable) del(h uint64) {
	if t.n == 0 {
		return
	}
	i := t.slot(h)
	for {
		if t.vals[i] == nil {
			return
		}
		if t.keys[i] == h {
			break
		}
		i = (i + 1) & t.mask
	}
	for j := (i + 1) & t.mask; t.vals[j] != nil; j = (j + 1) & t.mask {
		// Move j's entry into the hole at i unless its home slot lies
		// cyclically in (i, j]: then it is still reachable from home.
		if home := t.slot(t.keys[j]); (j-home)&t.mask >= (j-i)&t.mask {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.keys[i], t.vals[i] = 0, nil
	t.n--
}

func (t *blockTable) grow() {
	size := max(blockTableMin, 2*len(t.vals))
	keys, vals := t.keys, t.vals
	t.keys, t.vals, t.n, t.mask = make([]uint64, size), make([]*block, size), 0, uint64(size-1)
	for i, b := range vals {
		if b != nil {
			t.put(keys[i], b)
		}
	}
}

// reset empties the table, keeping its size.
func (t *blockTable) reset() {
	clear(t.keys)
	clear(t.vals)
	t.n = 0
}
