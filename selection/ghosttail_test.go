package selection

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// indexState is everything of x a learn writes: the slabs and tables,
// the lists, the holders, the free list and the counts.
func indexState(x *Index) []any {
	return []any{x.btab, x.blocks, x.bits, x.ptab, x.pairs, x.pfree, x.head, x.tail, x.ghead, x.gtail,
		x.ghosts, x.gone, x.cut, x.reps, x.n}
}

// TestGhostTailMatchesFullPath holds the learn of a prompt resent past its
// replica's horizon or capacity (ghostTail: its dropped tail the newest
// ghosts) to the full path's revival and drop, field for field and the
// probe's age, on
// prompts resent, extended and cut short over a few replicas whose
// horizons and capacities change, in a budget small enough to evict.
func TestGhostTailMatchesFullPath(t *testing.T) {
	for _, budget := range []int64{64 << 10, 8 << 20} {
		fast, full := NewIndex(budget), NewIndex(budget)
		full.noTail = true
		r := rand.New(rand.NewPCG(5, uint64(budget)))
		next := uint64(1 << 40)
		chain := func(n int) []uint64 {
			p := make([]uint64, n)
			for i := range p {
				p[i] = next
				next++
			}
			return p
		}
		var prompts [][]uint64
		for range 12 {
			prompts = append(prompts, chain(1+r.IntN(12)))
		}
		taken := 0
		for step := range 20000 {
			s := Slot(r.IntN(4))
			switch r.IntN(40) {
			case 0:
				h := int64(r.IntN(8))
				fast.SetHorizon(s, h)
				full.SetHorizon(s, h)
			case 1:
				c := int64(r.IntN(16))
				fast.SetCapacity(s, c)
				full.SetCapacity(s, c)
			case 2:
				i := r.IntN(len(prompts))
				prompts[i] = append(slices.Clone(prompts[i]), chain(1+r.IntN(3))...)
			}
			p := prompts[r.IntN(len(prompts))]
			if r.IntN(8) == 0 {
				p = p[:1+r.IntN(len(p))]
			}
			before := fast.reps
			clock := int64(-1)
			if int(s) < len(before) {
				clock = before[s].clock
			}
			tail := fast.gtail
			probe := r.IntN(len(p) + 2)
			if a, b := fast.learn(p, s, probe), full.learn(p, s, probe); a != b {
				t.Fatalf("budget %d step %d: probe %d of %d blocks on %d: age %d, full path %d", budget, step, probe, len(p), s, a, b)
			}
			if !reflect.DeepEqual(indexState(fast), indexState(full)) {
				t.Fatalf("budget %d step %d: the states differ after learning %d blocks on %d", budget, step, len(p), s)
			}
			if clock >= 0 && tail != 0 && fast.reps[s].clock == clock+int64(len(p)) && fast.gtail == tail &&
				fast.blocks[tail-1].key != 0 && slices.Contains(p, fast.blocks[tail-1].key) {
				taken++ // the prompt's tail was the newest ghosts before and after
			}
		}
		if taken == 0 {
			t.Errorf("budget %d: no prompt resent past its horizon", budget)
		}
	}
}

// TestGhostTailFreeListShort: a prompt's dropped tail is still the newest
// ghosts, but another replica's learn took the free pairs it left: the
// revival would append pairs to the slab, so the full path runs.
func TestGhostTailFreeListShort(t *testing.T) {
	fast, full := NewIndex(8<<20), NewIndex(8<<20)
	full.noTail = true
	p, q := []uint64{11, 12, 13, 14}, []uint64{21, 22}
	for _, x := range []*Index{fast, full} {
		x.SetHorizon(0, 2)
		x.Learn(p, 0) // 13 and 14 dropped: the newest ghosts, two free pairs
		x.Learn(q, 1) // the free pairs taken
	}
	if fast.pfree != 0 {
		t.Fatalf("free list not empty: %d", fast.pfree)
	}
	fast.Learn(p, 0)
	full.Learn(p, 0)
	if !reflect.DeepEqual(indexState(fast), indexState(full)) {
		t.Fatal("the states differ")
	}
	// With the free pairs back, the resent prompt takes ghostTail's way.
	for _, x := range []*Index{fast, full} {
		x.Learn(p, 0)
	}
	if !reflect.DeepEqual(indexState(fast), indexState(full)) {
		t.Fatal("the states differ on the second resend")
	}
}
