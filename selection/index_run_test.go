package selection

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// resentDigestWant are the digests TestIndexDigestResent got from the
// index of main at b3fd693, before the learn revived and dropped runs of
// blocks as one (splice16): the change must leave every belief, order,
// stamp, count and byte where it was.
var resentDigestWant = map[int64]uint64{
	(64<<10)<<4 | 1: 0x386339652068690c,
	(64<<10)<<4 | 2: 0xad162afb73108c36,
	(1<<20)<<4 | 1:  0xb0a9aefb5d365a3c,
	(1<<20)<<4 | 2:  0x35d799a70dd22ba9,
	(4<<20)<<4 | 1:  0xd1842ecc017d4dd7,
	(4<<20)<<4 | 2:  0x8d8b88f79e86776b,
	(64<<20)<<4 | 1: 0xeae099a5203c7476,
	(64<<20)<<4 | 2: 0x8e4de55b9c3e102b,
}

// resentDigest drives an index through a seeded random sequence shaped
// like the overhead benchmark's long-256KiB cycle and its neighbours, and
// digests what it believes after each op (as indexDigest does): long
// chained prompts sent again and again to a few replicas whose horizons
// and capacities drop them (so that their blocks are revived from the
// ghost list in runs and dropped in runs), mixed with prompts sharing a
// prefix (blocks held by several replicas: pairs in the pair table),
// fresh prompts whose blocks take ghosts' entries (broken ghost runs),
// cut and extended resends, replies, forgets and a budget from one that
// evicts at every learn to one that never does.
func resentDigest(budget int64, seed uint64) uint64 {
	r := rand.New(rand.NewPCG(seed, uint64(budget)))
	x := NewIndex(budget)
	d := xxhash.New()
	put := func(v uint64) {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		d.Write(b[:])
	}
	const slots = 70
	var interest SlotSet
	for s := range Slot(slots) {
		interest.Add(s)
	}
	next := uint64(1 << 40)
	chain := func(n int) []uint64 {
		p := make([]uint64, n)
		for i := range p {
			p[i] = next
			next++
		}
		return p
	}
	shared := chain(40)
	var prompts [][]uint64
	for range 24 {
		n := 1 + r.IntN(1100)
		p := chain(n)
		if r.IntN(4) == 0 {
			p = append(slices.Clone(shared[:1+r.IntN(len(shared))]), p...)
		}
		prompts = append(prompts, p)
	}
	for op := 0; op < 3000; op++ {
		s := Slot(r.IntN(8))
		if r.IntN(10) == 0 {
			s = Slot(r.IntN(slots))
		}
		switch k := r.IntN(100); {
		case k < 6:
			// About one prompt, or less, or much more.
			x.SetHorizon(s, int64(r.IntN(2400)))
		case k < 9:
			x.SetCapacity(s, int64(r.IntN(2400)))
		case k < 10:
			x.Forget(s)
		case k < 13:
			p := prompts[r.IntN(len(prompts))]
			x.Replied(p[len(p)-1], s, r.IntN(40))
		case k < 14:
			p := prompts[r.IntN(len(prompts))]
			x.dropReply(p[len(p)-1], s)
		default:
			var p []uint64
			switch {
			case k < 20:
				// A fresh prompt in place of an old one.
				p = chain(1 + r.IntN(1100))
				prompts[r.IntN(len(prompts))] = p
			case k < 26:
				// Cut or extended.
				p = slices.Clone(prompts[r.IntN(len(prompts))])
				if r.IntN(2) == 0 {
					p = p[:1+r.IntN(len(p))]
				} else {
					p = append(p, chain(r.IntN(200))...)
				}
			case k < 28:
				// A block repeated.
				p = slices.Clone(prompts[r.IntN(len(prompts))])
				i, j := r.IntN(len(p)), r.IntN(len(p))
				p[i] = p[j]
			default:
				p = prompts[r.IntN(len(prompts))]
			}
			putLearn(put, x, p, s, r.IntN(len(p)+2), interest, slots)
		}
		putState(put, x, slots, op%8 == 0)
	}
	if err := x.checkTables(); err != nil {
		panic(fmt.Sprintf("budget %d: %v", budget, err))
	}
	if testing.Verbose() {
		fmt.Printf("resent budget %d seed %d: entries %d pairs %d bytes %d evictions %d dropped %d\n", budget, seed, x.Entries(), x.Pairs(), x.Bytes(), x.Evictions(), x.Dropped())
	}
	return d.Sum64()
}

// resentBudgets are TestIndexDigestResent's budgets: evicting at nearly
// every learn, at some, and never.
var resentBudgets = []int64{64 << 10, 1 << 20, 4 << 20, 64 << 20}

// TestIndexDigestResent checks that the index believes, op after op,
// exactly what the index before the run splices believed
// (resentDigestWant), on the resent-prompt sequences of resentDigest.
func TestIndexDigestResent(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	for _, budget := range resentBudgets {
		for seed := uint64(1); seed <= 2; seed++ {
			got := resentDigest(budget, seed)
			key := budget<<4 | int64(seed)
			want, ok := resentDigestWant[key]
			if !ok {
				t.Errorf("budget %d seed %d: digest %#x, none recorded", budget, seed, got)
				continue
			}
			if got != want {
				t.Errorf("budget %d seed %d: digest %#x, want %#x", budget, seed, got, want)
			}
		}
	}
}

// TestRunsMatchModel follows the overhead benchmark's cycle, where every
// learn revives a row of ghosts (reviveRun) and the horizon drops the
// replica's previous prompt (dropTail), against the index's model, with
// the cases the digests reach rarely: a revival into an index that holds
// nothing (both lists empty), a run cut short by a block the prompt
// repeats or by another replica's pair; and, under a budget of three
// prompts, a pair slab with room for part of a run only (there the
// invariants only: the model has no budget; TestIndexDigestResent checks
// what such an index believes).
func TestRunsMatchModel(t *testing.T) {
	const n = 48
	tests := []struct {
		name string
		give func(x *Index, m *indexModel, learn func([]uint64, Slot))
	}{
		{"resent, one replica, nothing else held", func(x *Index, m *indexModel, learn func([]uint64, Slot)) {
			a := blocksOf(1, n)
			for range 3 {
				learn(a, 0)
			}
		}},
		{"forgotten, then resent into an index that holds nothing", func(x *Index, m *indexModel, learn func([]uint64, Slot)) {
			a := blocksOf(1, n)
			learn(a, 0)
			x.Forget(0)
			m.forget(0)
			learn(a, 0)
			learn(blocksOf(2, n), 0)
			learn(a, 0)
		}},
		{"two prompts alternating on two replicas", func(x *Index, m *indexModel, learn func([]uint64, Slot)) {
			a, b := blocksOf(1, n), blocksOf(2, n)
			for i := range 8 {
				learn(a, Slot(i%2))
				learn(b, Slot(1-i%2))
			}
		}},
		{"a block repeated in the resend", func(x *Index, m *indexModel, learn func([]uint64, Slot)) {
			a := blocksOf(1, n)
			learn(a, 0)
			learn(blocksOf(3, n), 0)
			r := slices.Clone(a)
			r[n/2] = r[n/4]
			learn(r, 0)
			learn(a, 0)
		}},
		{"a prefix shared with another replica", func(x *Index, m *indexModel, learn func([]uint64, Slot)) {
			a := blocksOf(1, n)
			learn(a, 0)
			learn(blocksOf(3, n), 0)
			learn(a[:n/3], 1)
			learn(a, 0)
			learn(blocksOf(4, n), 0)
			learn(a, 0)
		}},
	}
	for _, tt := range tests {
		for _, budget := range []int64{1 << 30, 3 * n * entryBytes} {
			t.Run(fmt.Sprintf("%s/budget=%d", tt.name, budget), func(t *testing.T) {
				x := NewIndex(budget)
				m := newIndexModel()
				for s := range Slot(2) {
					x.SetHorizon(s, n)
					m.rep(s).horizon = n
				}
				step := 0
				learn := func(p []uint64, s Slot) {
					step++
					x.Learn(p, s)
					if budget < 1<<30 {
						// The model has no budget: check the invariants only.
						if err := x.checkTables(); err != nil {
							t.Fatalf("step %d: %v", step, err)
						}
						return
					}
					m.learn(p, s, 0)
					g, reps := x.state(2)
					if diff := cmp.Diff(m.global, g); diff != "" {
						t.Fatalf("step %d: global list (-want +got):\n%s", step, diff)
					}
					for s := range Slot(2) {
						want := m.rep(s).list
						if diff := cmp.Diff(want, reps[s], cmp.AllowUnexported(modelPair{}), cmpopts.EquateEmpty()); diff != "" {
							t.Fatalf("step %d: slot %d (-want +got):\n%s", step, s, diff)
						}
					}
					if err := x.checkTables(); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
				}
				tt.give(x, m, learn)
			})
		}
	}
}

// TestTableSize checks tableSize against its definition, the least power
// of two at least 2n, by doubling.
func TestTableSize(t *testing.T) {
	want := func(n int) int {
		size := 1
		for size < 2*n {
			size <<= 1
		}
		return size
	}
	for _, n := range []int{-1, 0, 1, 2, 3, 4, 5, 255, 256, 257, 1<<20 - 1, 1 << 20, 1<<20 + 1, 1 << 30} {
		if n > math.MaxInt/4 { // 2n's table does not fit an int (32-bit builds)
			continue
		}
		if got := tableSize(n); got != want(n) {
			t.Errorf("tableSize(%d) = %d, want %d", n, got, want(n))
		}
	}
	for n := 0; n < 1<<16; n++ {
		if got := tableSize(n); got != want(n) {
			t.Fatalf("tableSize(%d) = %d, want %d", n, got, want(n))
		}
	}
}

// TestWarmTailStopsAtTheDrops: dropTail's prefetch reads the pairs it is
// about to drop and no more: up to its limit, or down to the first pair
// younger than the horizon (a replica's list whose drops are a few pairs
// past the horizon no longer pays for warmRun of them per learn).
func TestWarmTailStopsAtTheDrops(t *testing.T) {
	x := NewIndex(1 << 20)
	for i := range 40 {
		x.Learn([]uint64{uint64(1000 + i)}, 0) // 40 pairs of slot 0, one block each
	}
	r := &x.reps[0]
	for _, tc := range []struct {
		left, horizon int64
		want          uint32
	}{
		{-1, 0, warmRun}, // no bound: a whole run
		{3, 0, 3},        // a limit of 3 drops
		{-1, 38, 2},      // the two pairs 38 and 39 touches old
		{1, 38, 1},       // both bounds: the nearer
		{-1, 41, 0},      // none old enough
	} {
		x.warmSink = 99
		x.warmTail(r.tail, tc.left, r.clock, tc.horizon)
		if x.warmSink != tc.want { // each block has one holder: the sum counts the pairs read
			t.Errorf("left %d horizon %d: warmed %d pairs, want %d", tc.left, tc.horizon, x.warmSink, tc.want)
		}
	}
}
