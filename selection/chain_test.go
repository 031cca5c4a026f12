package selection

import (
	"sync"
	"testing"
)

// tokensOf is n tokens of family fam, the first shared of them equal to
// family base's (a prompt that shares a prefix with another).
func tokensOf(base, fam uint64, shared, n int) []uint64 {
	toks := make([]uint32, n)
	for i := range toks {
		f := fam
		if i < shared {
			f = base
		}
		toks[i] = uint32(f)*1_000_003 + uint32(i)
	}
	return AppendTokenBlocks(nil, base, toks, 1)
}

// routeTo routes blocks to the only usable candidate i and returns the
// reservation, its prefill still pending.
func routeTo(t *testing.T, rt *Router, cands []Candidate, i int, blocks []uint64) *Reservation {
	t.Helper()
	only := make([]Candidate, len(cands))
	copy(only, cands)
	for k := range only {
		only[k].Usable = k == i
	}
	d, res := rt.Route(features(rt.Config(), blocks, 0), only, NewScratch(len(only)), nil, nil)
	if d.Index != i || res == nil {
		t.Fatalf("routing to candidate %d: %+v", i, d)
	}
	return res
}

// A request whose prompt extends (or shares a prefix
// with) one still in flight on the same replica counts the shared context
// once; released, the earlier request takes off only what it still
// counts. Unrelated prompts and other replicas are untouched;
// NoChainDedup is the rule before.
func TestChainDedupCountsContextOnce(t *testing.T) {
	for _, dedup := range []bool{false, true} {
		rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
		rt = rt.WithOptions(Options{NoChainDedup: !dedup})
		s0, s1 := cands[0].Slot, cands[1].Slot
		a := routeTo(t, rt, cands, 0, blocksOf(1, 200)) // 3,200 tokens
		b := routeTo(t, rt, cands, 0, blocksOf(1, 240)) // extends a: 3,840
		c := routeTo(t, rt, cands, 0, blocksOf(2, 100)) // unrelated: 1,600
		o := routeTo(t, rt, cands, 1, blocksOf(1, 260)) // a's prefix elsewhere: 4,160
		want := int64(3200 + 3840 + 1600)
		if dedup {
			want = 3840 + 1600
		}
		if got := rt.Resident(s0); got != want {
			t.Fatalf("dedup %v: resident %d, want %d", dedup, got, want)
		}
		if got := rt.Resident(s1); got != 4160 {
			t.Fatalf("dedup %v: the other replica's resident %d, want 4160", dedup, got)
		}
		a.Release()
		if want -= 3200; dedup {
			want += 3200 // a no longer counted anything
		}
		if got := rt.Resident(s0); got != want {
			t.Fatalf("dedup %v: after a's release resident %d, want %d", dedup, got, want)
		}
		b.Release()
		c.Release()
		o.Release()
		if rt.Resident(s0) != 0 || rt.Resident(s1) != 0 {
			t.Fatalf("dedup %v: resident %d / %d after every release", dedup, rt.Resident(s0), rt.Resident(s1))
		}
	}

	// A prompt sharing a's first 150 of 200 blocks (then diverging): a
	// keeps its 50-block tail.
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
	a := routeTo(t, rt, cands, 0, tokensOf(1, 9, 200, 200))
	d := routeTo(t, rt, cands, 0, tokensOf(1, 9, 150, 250))
	if got := rt.Resident(cands[0].Slot); got != 50*16+250*16 {
		t.Fatalf("resident %d, want %d", got, 50*16+250*16)
	}
	d.Release()
	a.Release()
	if got := rt.Resident(cands[0].Slot); got != 0 {
		t.Fatalf("resident %d after every release", got)
	}
}

// A shortfall is not read as eviction when the
// prompt extends a request still prefilling on the replica (the engine
// had not computed it yet); once that request's prefill is done, a
// shortfall is eviction again. ObserveShadowed is the rule before.
func TestObserveInflightSkipsUncomputed(t *testing.T) {
	for _, tt := range []struct {
		name     string
		opt      Options
		done     bool // the earlier request's prefill finished first
		wantTrim bool
	}{
		{"rule before", Options{ObserveShadowed: true}, false, true},
		{"still prefilling", Options{}, false, false},
		{"prefill done", Options{}, true, true},
	} {
		rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 1)
		rt = rt.WithOptions(tt.opt)
		rt.Learn(&Features{Blocks: blocksOf(5, 40)}, cands[0].Slot)
		a := routeTo(t, rt, cands, 0, blocksOf(1, 8))
		if tt.done {
			a.PrefillDone()
		}
		b := routeTo(t, rt, cands, 0, blocksOf(1, 20))
		if b.predicted != 8 {
			t.Fatalf("%s: predicted %d blocks, want 8", tt.name, b.predicted)
		}
		if got := rt.Observe(b, 0, 0, 0); got != tt.wantTrim {
			t.Errorf("%s: Observe of a 0-token hit changed the index: %v, want %v", tt.name, got, tt.wantTrim)
		}
		if h := rt.Index().Horizon(cands[0].Slot); (h > 0) != tt.wantTrim {
			t.Errorf("%s: horizon %d", tt.name, h)
		}
		b.Release()
		a.Release()
	}
}

// Route allocates nothing once the scratch and the reservations exist,
// also when a prompt finds another in flight.
func TestChainRouteAllocs(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 4)
	s := NewScratch(len(cands))
	f := features(rt.Config(), blocksOf(1, 200), 0)
	g := features(rt.Config(), blocksOf(1, 240), 0)
	twoRoutesAllocFree(t, rt, cands, s, f, g)
}

// BenchmarkRouteInflight is Route on a replica with 64 other requests in
// flight (the chain list reserveChain scans), against the rule before
// (no list).
func BenchmarkRouteInflight(b *testing.B) {
	for _, o := range []struct {
		name string
		opt  Options
	}{{"rule", Options{}}, {"before", Options{NoChainDedup: true, ObserveShadowed: true}}} {
		b.Run(o.name, func(b *testing.B) {
			rt, cands := newTestRouter(b, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 1)
			rt = rt.WithOptions(o.opt)
			s := NewScratch(1)
			held := make([]Reservation, 64)
			for i := range held {
				rt.Route(features(rt.Config(), blocksOf(uint64(i+2), 512), 0), cands, s, nil, &held[i])
			}
			f := features(rt.Config(), blocksOf(1, 1024), 300)
			var res Reservation
			b.ReportAllocs()
			for b.Loop() {
				_, r := rt.Route(f, cands, s, nil, &res)
				r.Release()
			}
		})
	}
}

// Routes and releases from many goroutines, prompts extending one
// another, keep the chain lists and the resident count consistent: every
// release done, nothing stays resident, under SharedOnce too (run with
// -race).
func TestChainConcurrent(t *testing.T) {
	for _, opt := range []Options{{}, {SharedOnce: true}} {
		chainConcurrent(t, opt)
	}
}

func chainConcurrent(t *testing.T, opt Options) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 3)
	rt = rt.WithOptions(opt)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := NewScratch(len(cands))
			var held []*Reservation
			for i := range 200 {
				f := features(rt.Config(), blocksOf(uint64(g%3+1), 50+i%40), 0)
				_, r := rt.Route(f, cands, s, nil, nil)
				if i%3 == 0 {
					r.PrefillDone()
				}
				held = append(held, r)
				if len(held) > 5 {
					held[0].Release()
					held = held[1:]
				}
			}
			for _, r := range held {
				r.Release()
			}
		}()
	}
	wg.Wait()
	for _, c := range cands {
		if inf, pend := rt.Load(c.Slot); inf != 0 || pend != 0 || rt.Resident(c.Slot) != 0 {
			t.Errorf("slot %d after every release: %d in flight, %d pending, %d resident", c.Slot, inf, pend, rt.Resident(c.Slot))
		}
		if l := &rt.chains[c.Slot]; l.head != nil || l.kv.Load() != 0 {
			t.Errorf("shared once %v, slot %d: chain list not empty (KV context %d)", opt.SharedOnce, c.Slot, l.kv.Load())
		}
	}
}

// twoRoutesAllocFree fails t unless routing f then g, both in flight,
// and releasing them allocates nothing.
func twoRoutesAllocFree(t *testing.T, rt *Router, cands []Candidate, s *Scratch, f, g *Features) {
	t.Helper()
	var r1, r2 Reservation
	allocs := testing.AllocsPerRun(200, func() {
		_, a := rt.Route(f, cands, s, nil, &r1)
		_, b := rt.Route(g, cands, s, nil, &r2)
		b.Release()
		a.Release()
	})
	if allocs != 0 {
		t.Fatalf("Route: %v allocations, want 0", allocs)
	}
}
