package selection

import (
	"strings"
	"testing"
)

// A replica's capacity bounds what it is believed to hold: what ramjet
// sent it beyond it is presumed evicted in LRU order, deepest blocks of
// the least recent prompt first, so overlap decays as the engine's does.
func TestCapacityEvictsLeastRecentFirst(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024}
	rt, cands := newTestRouter(t, c, 2)
	rt.SetCapacity(cands[0].Slot, 10*16)
	if got := rt.Capacity(cands[0].Slot); got != 160 {
		t.Fatalf("capacity %d tokens, want 160", got)
	}
	a, b := blocksOf(1, 8), blocksOf(2, 8)
	rt.Learn(&Features{Blocks: a}, cands[0].Slot)
	rt.Learn(&Features{Blocks: a}, cands[1].Slot) // unbounded
	rt.Learn(&Features{Blocks: b}, cands[0].Slot)
	if got := rt.Index().Held(cands[0].Slot); got != 10 {
		t.Fatalf("slot 0 holds %d blocks, want its capacity 10", got)
	}
	var interest mask
	interest.Add(cands[0].Slot)
	interest.Add(cands[1].Slot)
	var depth [MaxReplicas]int32
	rt.Index().Depths(a, interest, &depth)
	if depth[cands[0].Slot] != 2 || depth[cands[1].Slot] != 8 {
		t.Fatalf("depths of the older prompt %v, want [2 8]", depth[:2])
	}
	rt.Index().Depths(b, interest, &depth)
	if depth[cands[0].Slot] != 8 {
		t.Fatalf("newest prompt depth %d, want 8", depth[cands[0].Slot])
	}
	// Re-routing a prompt makes it the most recent again.
	rt.Learn(&Features{Blocks: a}, cands[0].Slot)
	rt.Index().Depths(b, interest, &depth)
	if depth[cands[0].Slot] != 2 {
		t.Fatalf("after a is re-sent, b keeps %d blocks, want 2", depth[cands[0].Slot])
	}
	// Lowering the capacity evicts at once; 0 falls back to kv_capacity
	// (unbounded here).
	rt.SetCapacity(cands[0].Slot, 4*16)
	if got := rt.Index().Held(cands[0].Slot); got != 4 {
		t.Fatalf("holds %d blocks after the capacity dropped to 4", got)
	}
	rt.SetCapacity(cands[0].Slot, 0)
	if got := rt.Capacity(cands[0].Slot); got != 0 {
		t.Fatalf("capacity %d after reset, want unbounded", got)
	}
}

// Config.KVCapacity applies to every replica without a capacity of its
// own, including ones registered later and after a Retune.
func TestKVCapacityDefault(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024, KVCapacity: 320}, 2)
	if got := rt.Capacity(cands[1].Slot); got != 320 {
		t.Fatalf("capacity %d, want kv_capacity 320", got)
	}
	rt.SetCapacity(cands[0].Slot, 1600)
	c := rt.Config()
	c.KVCapacity = 640
	rt2, err := rt.Retune(c)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := rt2.Capacity(cands[0].Slot), rt2.Capacity(cands[1].Slot); a != 1600 || b != 640 {
		t.Fatalf("after retune: capacities %d, %d; want 1600 (own), 640 (kv_capacity)", a, b)
	}
	bad := Config{}
	bad.SetDefaults()
	bad.KVCapacity = -1
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "kv_capacity") {
		t.Fatalf("negative kv_capacity: %v", err)
	}
}
