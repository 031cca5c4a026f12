package selection

import (
	"testing"
	"unsafe"
)

func TestLoadCellOneCacheLine(t *testing.T) {
	if got := unsafe.Sizeof(loadCell{}); got != 64 {
		t.Fatalf("loadCell is %d bytes, want 64 (one cache line)", got)
	}
}

func TestSetExternalLoadCountsInLoad(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 3)
	cost := float64(rt.Config().RequestCost)
	f := features(rt.Config(), blocksOf(1, 8), 100)
	s := NewScratch(len(cands))

	rt.SetExternalLoad(cands[1].Slot, 3, 2, 0)
	if r, w, kv := rt.ExternalLoad(cands[1].Slot); r != 3 || w != 2 || kv != 0 {
		t.Fatalf("ExternalLoad = %d, %d, %d; want 3, 2, 0", r, w, kv)
	}
	res := rt.Reserve(cands[0].Slot, 40)
	d := rt.Pick(f, cands, s)
	if s.Load[0] != cost+40 || s.Load[1] != 5*cost || s.Load[2] != 0 {
		t.Fatalf("loads = %v, want [%v %v 0]", s.Load, cost+40, 5*cost)
	}
	if d.Slot != cands[2].Slot {
		t.Fatalf("picked slot %d, want the unloaded %d", d.Slot, cands[2].Slot)
	}
	res.Release()

	// Replaced, not added; zeros mean none.
	rt.SetExternalLoad(cands[1].Slot, 1, 0, 0)
	rt.Pick(f, cands, s)
	if s.Load[1] != cost {
		t.Fatalf("load after replacing = %v, want %v", s.Load[1], cost)
	}
	rt.SetExternalLoad(cands[1].Slot, 0, 0, 0)
	rt.Pick(f, cands, s)
	if s.Load[1] != 0 {
		t.Fatalf("load after zeros = %v, want 0", s.Load[1])
	}
}

func TestSetExternalLoadClamps(t *testing.T) {
	rt, cands := newTestRouter(t, Config{}, 1)
	sl := cands[0].Slot
	rt.SetExternalLoad(sl, -4, -1, -100)
	if r, w, kv := rt.ExternalLoad(sl); r != 0 || w != 0 || kv != 0 {
		t.Fatalf("negative figures stored as %d, %d, %d", r, w, kv)
	}
	rt.SetExternalLoad(sl, 1<<62, 1<<62, 1<<62)
	r, w, kv := rt.ExternalLoad(sl)
	if r != maxExternalRequests || w != maxExternalRequests || kv != maxExternalKV {
		t.Fatalf("huge figures stored as %d, %d, %d", r, w, kv)
	}
	if ld := rt.load(sl, 0); !(ld > 0) || ld > 1<<53 {
		t.Fatalf("load with huge figures = %v", ld)
	}
	// Out-of-range slots are ignored.
	rt.SetExternalLoad(-1, 1, 1, 1)
	rt.SetExternalLoad(MaxReplicas, 1, 1, 1)
	if r, w, kv := rt.ExternalLoad(MaxReplicas); r != 0 || w != 0 || kv != 0 {
		t.Fatalf("out-of-range slot reads %d, %d, %d", r, w, kv)
	}
}

func TestExternalKVUnderContextWeight(t *testing.T) {
	rt, cands := newTestRouter(t, Config{ContextWeight: 2}, 2)
	sl := cands[0].Slot
	rt.SetCapacity(sl, 1000)
	rt.SetExternalLoad(sl, 0, 0, 100)
	// 2 x 100^2 / 1000
	if got := rt.load(sl, 0); got != 20 {
		t.Fatalf("load with 100 external KV tokens of 1000 = %v, want 20", got)
	}
	// Without a context weight the KV figure does not count.
	rt0, c0 := newTestRouter(t, Config{}, 1)
	rt0.SetExternalLoad(c0[0].Slot, 0, 0, 1_000_000)
	if got := rt0.load(c0[0].Slot, 0); got != 0 {
		t.Fatalf("load with context_weight 0 = %v, want 0", got)
	}
}

func TestUnregisterResetsExternalLoad(t *testing.T) {
	rt, cands := newTestRouter(t, Config{}, 2)
	sl := cands[1].Slot
	rt.SetExternalLoad(sl, 7, 3, 500)
	if !rt.Unregister(rt.Key(sl)) {
		t.Fatal("Unregister: not registered")
	}
	again, err := rt.Register("127.0.0.1:8009")
	if err != nil {
		t.Fatal(err)
	}
	if again != sl {
		t.Fatalf("slot not reused: got %d, want %d", again, sl)
	}
	if r, w, kv := rt.ExternalLoad(again); r != 0 || w != 0 || kv != 0 {
		t.Fatalf("new replica on the freed slot inherits external load %d, %d, %d", r, w, kv)
	}
	if ld := rt.load(again, 0); ld != 0 {
		t.Fatalf("new replica's load = %v, want 0", ld)
	}
}

func TestSetExternalLoadAllocs(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 64)
	f := features(rt.Config(), blocksOf(1, 64), 100)
	s := NewScratch(len(cands))
	i := int64(0)
	if n := testing.AllocsPerRun(200, func() {
		i++
		rt.SetExternalLoad(cands[i%64].Slot, i%5, i%3, i*16)
		_ = rt.Pick(f, cands, s)
	}); n != 0 {
		t.Fatalf("SetExternalLoad + Pick: %v allocs, want 0", n)
	}
}

// SetExternalLoad from a scraper goroutine while Pick and Route run: run
// under -race.
func TestSetExternalLoadConcurrent(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 8)
	f := features(rt.Config(), blocksOf(1, 32), 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range int64(2000) {
			rt.SetExternalLoad(cands[i%8].Slot, i%7, i%3, i)
		}
	}()
	s := NewScratch(len(cands))
	var res Reservation
	for range 2000 {
		d, r := rt.Route(f, cands, s, nil, &res)
		if d.Index < 0 || d.Index >= len(cands) {
			t.Fatalf("picked index %d", d.Index)
		}
		r.Release()
	}
	<-done
}
