package selection

import (
	"cmp"
	"slices"
)

// Beliefs is one replica's part of the approximate index, as a snapshot
// carries it: what ramjet believes the replica holds, in the order it
// would evict it.
type Beliefs struct {
	// Key is the replica key (Router.Register).
	Key string
	// Blocks are the block hashes the replica is believed to hold, least
	// recently routed first.
	Blocks []uint64
}

// ExportIndex returns what the approximate index believes every registered
// replica holds, by replica key (not by slot: slots do not survive a
// restart). maxBlocks bounds the blocks returned in all (0: no bound);
// past it each replica keeps its most recent blocks, in proportion to how
// many it holds. It holds the index's read lock while it copies.
func (rt *Router) ExportIndex(maxBlocks int) []Beliefs {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	x := rt.idx
	defer x.runlock(x.rlock())
	n := min(rt.Len(), len(x.reps))
	total := int64(0)
	for s := range n {
		if rt.keys[s] != "" {
			total += x.reps[s].blocks
		}
	}
	var out []Beliefs
	for s := range n {
		key, r := rt.keys[s], &x.reps[s]
		if key == "" || r.blocks == 0 {
			continue
		}
		keep := r.blocks
		if maxBlocks > 0 && total > int64(maxBlocks) {
			keep = r.blocks * int64(maxBlocks) / total
		}
		if keep == 0 {
			continue
		}
		blocks := make([]uint64, 0, keep)
		skip := r.blocks - keep
		for e := r.tail; e != 0; e = x.pairs[e-1].prev {
			if skip > 0 {
				skip--
				continue
			}
			blocks = append(blocks, x.blocks[x.pairs[e-1].blk-1].key)
		}
		out = append(out, Beliefs{Key: key, Blocks: blocks})
	}
	return out
}

// importChunk is how many beliefs ImportIndex adds per hold of the
// index's write lock (a few milliseconds): between two chunks routing
// reads the index and learning writes to it.
const importChunk = 2048

// hotImport bounds ImportIndex's first pass.
const hotImport = 4 * importChunk

// ImportIndex adds the beliefs of bs to the approximate index, for the
// replicas registered now; the beliefs of a key that is not registered
// (or unregistered during the import) are dropped. Each replica's blocks
// are touched in their order (least recent first), the replicas
// interleaved in proportion, so that each replica's eviction order is the
// exported one and the index's global order mixes them evenly. Capacity,
// horizon and the memory budget apply as to learned blocks. The index
// stays usable meanwhile: the write lock is held for importChunk beliefs
// at a time, so that a full index (about 0.5 s of CPU) never stalls a
// request for longer than one chunk. Since the most recent beliefs come
// last in that order and are the ones requests need, a first pass adds
// the most recent quarter (at most hotImport beliefs) before the import
// proper, which touches them again in their place. It returns the
// replicas and blocks imported.
func (rt *Router) ImportIndex(bs []Beliefs) (replicas, blocks int) {
	type item struct{ b, j int32 } // bs[b].Blocks[j]
	slot := make([]Slot, len(bs))
	var items []item
	top := Slot(-1)
	rt.mu.Lock()
	for i, b := range bs {
		s, ok := rt.slots[b.Key]
		slot[i] = -1
		if !ok || len(b.Blocks) == 0 {
			continue
		}
		slot[i] = s
		top = max(top, s)
		replicas++
		for j := range b.Blocks {
			items = append(items, item{int32(i), int32(j)})
		}
	}
	rt.mu.Unlock()
	if top < 0 {
		return 0, 0
	}
	// (j+1)/len(b), compared without division: every replica advances at
	// its own rate and all end together.
	slices.SortStableFunc(items, func(p, q item) int {
		return cmp.Compare(int64(p.j+1)*int64(len(bs[q.b].Blocks)), int64(q.j+1)*int64(len(bs[p.b].Blocks)))
	})
	x := rt.idx
	hot := 0
	if len(items) > importChunk {
		hot = min(len(items)/4, hotImport)
	}
	// The first pass's beliefs are touched again by the second, so that
	// the final order is the one above.
	passes := append(items[len(items)-hot:len(items):len(items)], items...)
	for len(passes) > 0 {
		chunk := passes[:min(importChunk, len(passes))]
		passes = passes[len(chunk):]
		// Registration first (the lock order of ExportIndex): a slot
		// whose replica left meanwhile takes no more of its beliefs.
		rt.mu.Lock()
		for i, s := range slot {
			if s >= 0 && rt.keys[s] != bs[i].Key {
				slot[i] = -1
			}
		}
		x.lock()
		x.widen(top)
		for _, it := range chunk {
			if s := slot[it.b]; s >= 0 {
				x.touch(bs[it.b].Blocks[it.j], s)
			}
		}
		for _, s := range slot {
			if s >= 0 {
				x.bound(s)
			}
		}
		x.unlock()
		rt.mu.Unlock()
	}
	for _, it := range items {
		if slot[it.b] >= 0 {
			blocks++
		}
	}
	return replicas, blocks
}
