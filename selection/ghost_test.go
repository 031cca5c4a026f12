package selection

import (
	"testing"
)

// A prompt dropped by a replica's horizon leaves ghosts: the index no
// longer believes any replica holds it, and when the prompt is learned
// again its blocks come back in their old entries, with no table
// insertion; a fresh prompt takes the ghosts' entries before the slab
// grows.
func TestIndexGhosts(t *testing.T) {
	x := NewIndex(64 << 20)
	const n = 300
	p, q := blocksOf(1, n), blocksOf(2, n)
	x.Learn(p, 0)
	entry := func(key uint64) uint32 { _, e := x.findEntry(key); return e }
	was := make([]uint32, n)
	for i, k := range p {
		was[i] = entry(k)
	}
	x.SetHorizon(0, n) // q's learn drops p
	x.Learn(q, 0)
	if got := x.Entries(); got != n {
		t.Fatalf("entries %d, want %d (q only)", got, n)
	}
	var interest SlotSet
	interest.Add(0)
	var depth [MaxReplicas]int32
	depth[0] = -1
	x.Depths(p, interest, &depth)
	if depth[0] != -1 || x.holds(p[0], 0) || x.findBlock(p[0]) != 0 {
		t.Fatalf("p is still believed (depth %d)", depth[0])
	}
	for i, k := range p {
		if e := entry(k); e != was[i] || x.blocks[e-1].pairs != ghost {
			t.Fatalf("block %d of p: entry %d, want the ghost %d", i, e, was[i])
		}
	}
	gone, bytes := x.gone, x.Bytes()
	x.Learn(p, 0) // drops q
	for i, k := range p {
		if e := entry(k); e != was[i] {
			t.Fatalf("block %d of p: entry %d, want its old %d back", i, e, was[i])
		}
	}
	if x.gone != gone {
		t.Fatalf("%d table deletions taking p back", x.gone-gone)
	}
	depth[0] = -1
	x.Depths(p, interest, &depth)
	if depth[0] != n {
		t.Fatalf("depth of p %d, want %d", depth[0], n)
	}
	// A fresh prompt takes the slab's unused entries, then q's ghosts':
	// no growth.
	unused := cap(x.blocks) - len(x.blocks)
	x.Learn(blocksOf(3, unused+n/2), 1)
	if x.Bytes() != bytes {
		t.Fatalf("bytes %d, want %d: the slab grew with ghosts to take", x.Bytes(), bytes)
	}
	if x.gone-gone != n/2 {
		t.Fatalf("%d ghosts' entries taken, want %d", x.gone-gone, n/2)
	}
	if err := x.checkTables(); err != nil {
		t.Fatal(err)
	}
}
