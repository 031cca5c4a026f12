package kvindex

import (
	"testing"
	"time"
)

// TestOwnSurvivesLoss: a block this router sent to a replica stays its own
// (Index.Own) when the engine stores it again after the index lost it:
// evicted by the engine (BlockRemoved) or by a fence, or predicted and
// dropped before its BlockStored (MaxPredicted reached, or its ttl passed
// while its request was still running). Blocks the router never sent there
// stay foreign through the same evictions, and a prediction its requests
// released and let expire is not remembered. MaxOwnGone bounds the memory.
func TestOwnSurvivesLoss(t *testing.T) {
	now := time.Unix(100, 0)
	clock := func() time.Time { return now }
	toks := seqTokens(500, 16) // four blocks of 4
	store := func(x *Index, r Replica, i int, hash uint64) {
		t.Helper()
		parent, has := uint64(0), false
		if i > 0 {
			parent, has = hash-1, true
		}
		x.Apply(r, batchOf(storedEv(parent, has, 4, toks[4*i:4*i+4], hash)))
	}
	remove := func(x *Index, r Replica, hashes ...uint64) {
		x.Apply(r, batchOf(Event{Kind: KindBlockRemoved, BlockHashes: hashes}))
	}

	t.Run("evicted and stored again", func(t *testing.T) {
		x := New(Config{BlockSize: 4, Now: clock})
		a, _ := x.Register("a")
		b, _ := x.Register("b")
		keys := x.Keys(nil, 0, toks)
		x.Hold(a, keys[:2], time.Minute) // routed to a, stored there
		store(x, a, 0, 10)
		store(x, a, 1, 11)
		x.Release(a, keys[:2], 0)
		store(x, b, 0, 20) // b: from traffic this router did not route
		store(x, b, 1, 21)
		if !x.Own(a, keys[0]) || !x.Own(a, keys[1]) || x.Own(b, keys[0]) {
			t.Fatalf("before: own a %v %v, b %v", x.Own(a, keys[0]), x.Own(a, keys[1]), x.Own(b, keys[0]))
		}
		remove(x, a, 10, 11)
		remove(x, b, 20, 21)
		if x.Own(a, keys[0]) || x.Held(a, keys[0]) {
			t.Fatal("an evicted block still held or own")
		}
		// The engine recomputes them (for a request routed while they were
		// held, so nothing was predicted), and b's too.
		store(x, a, 0, 10)
		store(x, a, 1, 11)
		store(x, b, 0, 20)
		store(x, b, 1, 21)
		if !x.Own(a, keys[0]) || !x.Own(a, keys[1]) {
			t.Errorf("re-stored on a: own %v %v, want both", x.Own(a, keys[0]), x.Own(a, keys[1]))
		}
		if x.Own(b, keys[0]) || x.Own(b, keys[1]) {
			t.Error("re-stored on b (never routed there): own")
		}
		// Through a fence (a lost feed, then its replay) too.
		x.Fence(a, FenceReconnect)
		store(x, a, 0, 10)
		if !x.Own(a, keys[0]) {
			t.Error("stored again after a fence: not own")
		}
	})

	t.Run("prediction dropped at the bound", func(t *testing.T) {
		x := New(Config{BlockSize: 4, Now: clock, MaxPredicted: 2})
		a, _ := x.Register("a")
		keys := x.Keys(nil, 0, toks)
		x.Hold(a, keys, time.Minute) // four predictions, two live
		if x.PredictionsDropped() != 2 {
			t.Fatalf("dropped %d, want 2", x.PredictionsDropped())
		}
		for i := range 4 {
			store(x, a, i, uint64(10+i))
		}
		x.Release(a, keys, 0)
		for i := range 4 {
			if !x.Own(a, keys[i]) {
				t.Errorf("block %d: not own", i)
			}
		}
	})

	t.Run("ttl passed while held, released and expired", func(t *testing.T) {
		now = time.Unix(100, 0)
		x := New(Config{BlockSize: 4, Now: clock})
		a, _ := x.Register("a")
		keys := x.Keys(nil, 0, toks)
		x.Hold(a, keys[:1], time.Second) // the request outlives the ttl
		x.Hold(a, keys[1:2], time.Second)
		x.Release(a, keys[1:2], 0) // this one ended: its block was not stored
		now = now.Add(2 * time.Second)
		if x.Predicted() != 0 {
			t.Fatalf("predicted %d after the ttl", x.Predicted())
		}
		store(x, a, 0, 10)
		store(x, a, 1, 11)
		if !x.Own(a, keys[0]) {
			t.Error("stored after its ttl, request still running: not own")
		}
		if x.Own(a, keys[1]) {
			t.Error("stored after its request ended and its prediction expired: own")
		}
		x.Release(a, keys[:1], 0)
	})

	t.Run("bounded", func(t *testing.T) {
		x := New(Config{BlockSize: 4, Now: clock, MaxOwnGone: 2})
		a, _ := x.Register("a")
		keys := x.Keys(nil, 0, toks)
		x.Hold(a, keys, time.Minute)
		for i := range 4 {
			store(x, a, i, uint64(10+i))
		}
		x.Release(a, keys, 0)
		remove(x, a, 10, 11, 12) // remembered: 11 and 12
		if n := x.OwnRemembered(); n != 2 {
			t.Errorf("OwnRemembered() = %d after three losses, want the bound, 2", n)
		}
		store(x, a, 0, 10)
		store(x, a, 1, 11)
		store(x, a, 2, 12)
		if x.Own(a, keys[0]) || !x.Own(a, keys[1]) || !x.Own(a, keys[2]) {
			t.Errorf("own %v %v %v, want false true true", x.Own(a, keys[0]), x.Own(a, keys[1]), x.Own(a, keys[2]))
		}
		if n := x.OwnRemembered(); n != 0 {
			t.Errorf("OwnRemembered() = %d after both were stored again, want 0", n)
		}
	})
}
