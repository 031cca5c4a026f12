package kvindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/selection"
)

// batch builds a decoded batch directly (bypassing the wire).
func batchOf(events ...Event) *Batch { return &Batch{Events: events} }

func storedEv(parent uint64, hasParent bool, bs int, tokens []uint32, hashes ...uint64) Event {
	return Event{Kind: KindBlockStored, BlockHashes: hashes, Parent: parent, HasParent: hasParent,
		TokenIDs: tokens, BlockSize: bs, Medium: "GPU"}
}

func overlaps(x *Index, tokens []uint32) []int {
	out := make([]int, x.NumReplicas())
	x.Overlap(x.Keys(nil, 0, tokens), out)
	return out
}

func TestIndexStoreRemoveClear(t *testing.T) {
	x := New(Config{BlockSize: 4})
	a, _ := x.Register("a:8000#0")
	b, _ := x.Register("b:8000#0")
	prompt := seqTokens(100, 16) // 4 blocks

	if got := overlaps(x, prompt); !cmp.Equal(got, []int{0, 0}) {
		t.Fatalf("empty index: %v", got)
	}
	// a stores blocks 0-1, then 2-3 chained by parent hash; b stores 0.
	x.Apply(a, batchOf(storedEv(0, false, 4, prompt[:8], 1, 2)))
	x.Apply(a, batchOf(storedEv(2, true, 4, prompt[8:16], 3, 4)))
	x.Apply(b, batchOf(storedEv(0, false, 4, prompt[:4], 901)))
	if got, want := overlaps(x, prompt), []int{16, 4}; !cmp.Equal(got, want) {
		t.Fatalf("after store: %v, want %v", got, want)
	}
	// A longer request: only the held prefix counts; a shorter one is capped.
	long := append(append([]uint32{}, prompt...), seqTokens(1, 9)...)
	if got, want := overlaps(x, long), []int{16, 4}; !cmp.Equal(got, want) {
		t.Errorf("long request: %v, want %v", got, want)
	}
	if got, want := overlaps(x, prompt[:7]), []int{4, 4}; !cmp.Equal(got, want) {
		t.Errorf("short request: %v, want %v", got, want)
	}
	// Removing a middle block cuts a's overlap there.
	x.Apply(a, batchOf(Event{Kind: KindBlockRemoved, BlockHashes: []uint64{3, 77}}))
	if got, want := overlaps(x, prompt), []int{8, 4}; !cmp.Equal(got, want) {
		t.Errorf("after remove: %v, want %v", got, want)
	}
	if x.UnknownRemovals() != 1 {
		t.Errorf("unknown removals %d, want 1", x.UnknownRemovals())
	}
	// A block whose parent is unknown cannot be keyed.
	x.Apply(b, batchOf(storedEv(555, true, 4, prompt[4:8], 902)))
	if x.Orphans() != 1 {
		t.Errorf("orphans %d, want 1", x.Orphans())
	}
	// Clearing a fences it: no overlap, not fresh, until its next event.
	x.Apply(a, batchOf(Event{Kind: KindAllBlocksCleared}))
	if x.Fresh(a) || !x.Fresh(b) {
		t.Errorf("fresh a=%v b=%v after clear", x.Fresh(a), x.Fresh(b))
	}
	if got, want := overlaps(x, prompt), []int{0, 4}; !cmp.Equal(got, want) {
		t.Errorf("after clear: %v, want %v", got, want)
	}
	if x.Entries() != 1 || x.Fences(FenceCleared) != 1 {
		t.Errorf("entries %d fences %d", x.Entries(), x.Fences(FenceCleared))
	}
	x.Apply(a, batchOf(storedEv(0, false, 4, prompt[:4], 1)))
	if !x.Fresh(a) {
		t.Error("a not fresh after an event")
	}
}

func TestIndexSkipsOtherTiersAndGroups(t *testing.T) {
	x := New(Config{BlockSize: 2})
	a, _ := x.Register("a")
	cpu := storedEv(0, false, 2, seqTokens(0, 2), 1)
	cpu.Medium = "CPU"
	group := storedEv(0, false, 2, seqTokens(0, 2), 2)
	group.GroupIdx = 1
	unknown := Event{Kind: KindUnknown}
	x.Apply(a, batchOf(cpu, group, unknown))
	if x.Entries() != 0 || x.Skipped() != 3 || x.Fresh(a) {
		t.Errorf("entries %d skipped %d fresh %v", x.Entries(), x.Skipped(), x.Fresh(a))
	}
	odd := storedEv(0, false, 4, seqTokens(0, 4), 3)
	x.Apply(a, batchOf(odd))
	if x.BlockSizeMismatches() != 1 || x.Entries() != 1 {
		t.Errorf("mismatches %d entries %d", x.BlockSizeMismatches(), x.Entries())
	}
}

func TestIndexLoRASeed(t *testing.T) {
	x := New(Config{BlockSize: 2})
	a, _ := x.Register("a")
	ev := storedEv(0, false, 2, seqTokens(0, 4), 1, 2)
	ev.LoraID, ev.HasLora = 7, true
	x.Apply(a, batchOf(ev))
	out := make([]int, 1)
	x.Overlap(x.Keys(nil, 0, seqTokens(0, 4)), out)
	if out[0] != 0 {
		t.Errorf("base-model request matched a LoRA block: %d", out[0])
	}
	x.Overlap(x.Keys(nil, Seed(7), seqTokens(0, 4)), out)
	if out[0] != 4 {
		t.Errorf("LoRA request overlap %d, want 4", out[0])
	}
}

func TestIndexBudget(t *testing.T) {
	x := New(Config{BlockSize: 1, MaxEntries: 10})
	a, _ := x.Register("a")
	for i := 0; i < 25; i++ {
		x.Apply(a, batchOf(storedEv(0, false, 1, []uint32{uint32(i)}, uint64(i+1))))
	}
	if x.Entries() != 10 || x.Evictions() != 15 {
		t.Fatalf("entries %d evictions %d", x.Entries(), x.Evictions())
	}
	if x.Bytes() != 10*EntryBytes {
		t.Errorf("bytes %d", x.Bytes())
	}
	// The most recent ones survive.
	out := make([]int, 1)
	x.Overlap(x.Keys(nil, 0, []uint32{24}), out)
	if out[0] != 1 {
		t.Error("most recent entry evicted")
	}
	x.Overlap(x.Keys(nil, 0, []uint32{0}), out)
	if out[0] != 0 {
		t.Error("oldest entry kept")
	}
}

func TestIndexPredict(t *testing.T) {
	now := time.Unix(1000, 0)
	x := New(Config{BlockSize: 2, Now: func() time.Time { return now }})
	a, _ := x.Register("a")
	b, _ := x.Register("b")
	prompt := seqTokens(0, 8)
	keys := x.Keys(nil, 0, prompt)
	// Feeds are fresh once they applied an event.
	x.Apply(a, batchOf(storedEv(0, false, 2, prompt[:2], 1)))
	x.Apply(b, batchOf(storedEv(0, false, 2, seqTokens(50, 2), 2)))

	x.Predict(b, keys[:3], 2*time.Second)
	out := make([]int, 2)
	x.Overlap(keys, out)
	if want := []int{2, 6}; !cmp.Equal(out, want) {
		t.Fatalf("with predictions: %v, want %v", out, want)
	}
	// Predictions chain onto stored blocks: a holds block 0, predicted 1-2.
	x.Predict(a, keys[1:3], 2*time.Second)
	x.Overlap(keys, out)
	if want := []int{6, 6}; !cmp.Equal(out, want) {
		t.Fatalf("stored+predicted: %v, want %v", out, want)
	}
	// A BlockStored confirms b's first block: one prediction fewer.
	n := x.Predicted()
	x.Apply(b, batchOf(storedEv(0, false, 2, prompt[:2], 3)))
	if x.Predicted() != n-1 {
		t.Errorf("predicted %d after confirm, want %d", x.Predicted(), n-1)
	}
	// Expiry.
	now = now.Add(3 * time.Second)
	x.Overlap(keys, out)
	if want := []int{2, 2}; !cmp.Equal(out, want) {
		t.Errorf("after expiry: %v, want %v", out, want)
	}
	x.Predict(a, nil, time.Second) // sweeps
	if x.Predicted() != 0 {
		t.Errorf("predicted %d after sweep", x.Predicted())
	}
	// The prediction budget holds.
	y := New(Config{BlockSize: 1, MaxPredicted: 5, Now: func() time.Time { return now }})
	c, _ := y.Register("c")
	y.Predict(c, y.Keys(nil, 0, seqTokens(0, 20)), time.Hour)
	if y.Predicted() != 5 {
		t.Errorf("predicted %d past a budget of 5", y.Predicted())
	}
	// Fencing drops predictions.
	x.Predict(a, keys, time.Hour)
	x.Fence(a, FenceGap)
	if x.Predicted() != 0 || x.Fresh(a) {
		t.Errorf("predicted %d fresh %v after fence", x.Predicted(), x.Fresh(a))
	}
}

func TestOverlapAllocs(t *testing.T) {
	now := time.Unix(0, 0)
	x := New(Config{BlockSize: 16, Now: func() time.Time { return now }})
	prompt := seqTokens(0, 1024)
	keys := x.Keys(nil, 0, prompt)
	for i := 0; i < 8; i++ {
		r, _ := x.Register(fmt.Sprintf("r%d", i))
		n := 16 * (i + 1) * 8
		hs := make([]uint64, n/16)
		for j := range hs {
			hs[j] = uint64(i)<<32 | uint64(j+1)
		}
		x.Apply(r, batchOf(storedEv(0, false, 16, prompt[:n], hs...)))
	}
	x.Predict(0, keys, time.Hour)
	out := make([]int, x.NumReplicas())
	allocs := testing.AllocsPerRun(100, func() { x.Overlap(keys, out) })
	if allocs != 0 {
		t.Errorf("Overlap allocates %v times", allocs)
	}
	want := []int{1024, 256, 384, 512, 640, 768, 896, 1024}
	if !cmp.Equal(out, want) {
		t.Errorf("overlap %v, want %v", out, want)
	}
}

func TestAnnotate(t *testing.T) {
	x := New(Config{BlockSize: 2})
	a, _ := x.Register("a")
	b, _ := x.Register("b")
	prompt := seqTokens(0, 6)
	x.Apply(a, batchOf(storedEv(0, false, 2, prompt[:4], 1, 2)))
	keys := x.Keys(nil, 0, prompt)
	cands := []selection.Candidate{{Slot: 3, Precise: true, Overlap: 99}, {Slot: 1}, {Slot: 2}}
	scratch := make([]int, x.NumReplicas())
	n := x.Annotate(keys, []Replica{b, a, -1}, cands, scratch)
	want := []selection.Candidate{{Slot: 3, Overlap: 99}, {Slot: 1, Precise: true, Overlap: 4}, {Slot: 2}}
	if diff := cmp.Diff(want, cands); diff != "" || n != 1 {
		t.Errorf("n %d; candidates (-want +got):\n%s", n, diff)
	}
	if allocs := testing.AllocsPerRun(50, func() { x.Annotate(keys, []Replica{b, a, -1}, cands, scratch) }); allocs != 0 {
		t.Errorf("Annotate allocates %v times", allocs)
	}
}

// model is the simple reference the property test checks Index against:
// per replica, engine hash -> the full token prefix ending with that block.
type model struct {
	reps  []map[uint64]string
	fresh []bool
}

func prefixKey(tokens []uint32) string { return fmt.Sprint(tokens) }

func (m *model) overlap(r int, tokens []uint32, bs int) int {
	if !m.fresh[r] {
		return 0
	}
	held := map[string]bool{}
	for _, p := range m.reps[r] {
		held[p] = true
	}
	d := 0
	for (d+1)*bs <= len(tokens) && held[prefixKey(tokens[:(d+1)*bs])] {
		d++
	}
	return d * bs
}

func TestIndexProperty(t *testing.T) {
	const (
		bs    = 2
		nreps = 3
	)
	iters := 3000
	if testing.Short() {
		iters = 500
	}
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		x := New(Config{BlockSize: bs})
		m := &model{}
		for i := 0; i < nreps; i++ {
			if _, err := x.Register(fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
			m.reps = append(m.reps, map[uint64]string{})
			m.fresh = append(m.fresh, false)
		}
		// prefixes: every token prefix stored so far, with its tokens, so
		// that chains grow and are shared between replicas.
		var prefixes [][]uint32
		held := make([]map[uint64][]uint32, nreps) // per replica, as in the model
		for i := range held {
			held[i] = map[uint64][]uint32{}
		}
		engineHash := func(r int, prefix []uint32) uint64 {
			// Engines hash their own way; distinct per replica on purpose.
			h := uint64(r+1) * 0x9E3779B97F4A7C15
			for _, t := range prefix {
				h = (h ^ uint64(t)) * 0x100000001B3
			}
			return h
		}
		deep := 0 // queries with a multi-block overlap: the test is not vacuous
		for it := 0; it < iters; it++ {
			r := rng.IntN(nreps)
			switch op := rng.IntN(100); {
			case op < 70: // store 1-3 blocks: extend a held chain, start one, or an orphan
				var base []uint32
				switch k := rng.IntN(6); {
				case k < 4 && len(held[r]) > 0:
					base = pick(rng, held[r])
				case k == 4 && len(prefixes) > 0:
					base = prefixes[rng.IntN(len(prefixes))]
				}
				n := 1 + rng.IntN(3)
				tokens := make([]uint32, n*bs)
				for i := range tokens {
					tokens[i] = uint32(rng.IntN(3))
				}
				ev := Event{Kind: KindBlockStored, BlockSize: bs, TokenIDs: tokens}
				full := append([]uint32{}, base...)
				if len(base) > 0 {
					ev.Parent, ev.HasParent = engineHash(r, base), true
				}
				_, parentKnown := m.reps[r][ev.Parent]
				for i := 0; i < n; i++ {
					full = append(full, tokens[i*bs:(i+1)*bs]...)
					p := append([]uint32{}, full...)
					h := engineHash(r, p)
					ev.BlockHashes = append(ev.BlockHashes, h)
					if !ev.HasParent || parentKnown {
						m.reps[r][h] = prefixKey(p)
						held[r][h] = p
						prefixes = append(prefixes, p)
					}
				}
				m.fresh[r] = true // an orphan is dropped, but events flow
				x.Apply(Replica(r), batchOf(ev))
			case op < 97: // remove some known and unknown hashes
				ev := Event{Kind: KindBlockRemoved}
				for i := rng.IntN(3); i > 0 && len(held[r]) > 0; i-- {
					h := engineHash(r, pick(rng, held[r]))
					ev.BlockHashes = append(ev.BlockHashes, h)
					delete(m.reps[r], h)
					delete(held[r], h)
				}
				ev.BlockHashes = append(ev.BlockHashes, rng.Uint64())
				m.fresh[r] = true
				x.Apply(Replica(r), batchOf(ev))
			case op < 99:
				x.Apply(Replica(r), batchOf(Event{Kind: KindAllBlocksCleared}))
				m.reps[r], held[r] = map[uint64]string{}, map[uint64][]uint32{}
				m.fresh[r] = false
			default:
				x.Fence(Replica(r), FenceGap)
				m.reps[r], held[r] = map[uint64]string{}, map[uint64][]uint32{}
				m.fresh[r] = false
			}
			// Query a random known prefix, extended, and check all replicas.
			var q []uint32
			if rr := rng.IntN(nreps); len(held[rr]) > 0 && rng.IntN(3) > 0 {
				q = append(q, pick(rng, held[rr])...)
			} else if len(prefixes) > 0 {
				q = append(q, prefixes[rng.IntN(len(prefixes))]...)
			}
			for i := rng.IntN(3); i > 0; i-- {
				q = append(q, uint32(rng.IntN(3)))
			}
			got := overlaps(x, q)
			for _, g := range got {
				if g > 2*bs {
					deep++
				}
			}
			for rr := 0; rr < nreps; rr++ {
				if want := m.overlap(rr, q, bs); got[rr] != want {
					t.Fatalf("seed %d iter %d: replica %d overlap %d, want %d (query %v)",
						seed, it, rr, got[rr], want, q)
				}
				if x.Fresh(Replica(rr)) != m.fresh[rr] {
					t.Fatalf("seed %d iter %d: replica %d fresh %v, want %v",
						seed, it, rr, x.Fresh(Replica(rr)), m.fresh[rr])
				}
			}
			var total int
			for _, mr := range m.reps {
				total += len(mr)
			}
			if int(x.Entries()) != total {
				t.Fatalf("seed %d iter %d: entries %d, want %d", seed, it, x.Entries(), total)
			}
		}
		if deep < iters/10 {
			t.Errorf("seed %d: only %d deep overlaps in %d queries", seed, deep, iters)
		}
		t.Logf("seed %d: %d deep overlaps, %d entries, %d orphans", seed, deep, x.Entries(), x.Orphans())
	}
}

// pick returns a random value of m (deterministic for a given rng).
func pick(rng *rand.Rand, m map[uint64][]uint32) []uint32 {
	ks := make([]uint64, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return m[ks[rng.IntN(len(ks))]]
}

func BenchmarkOverlap(b *testing.B) {
	for _, tc := range []struct{ tokens, replicas int }{{1024, 8}, {8192, 8}, {8192, 64}} {
		b.Run(fmt.Sprintf("tokens=%d/replicas=%d", tc.tokens, tc.replicas), func(b *testing.B) {
			x := New(Config{BlockSize: 16})
			prompt := seqTokens(0, tc.tokens)
			keys := x.Keys(nil, 0, prompt)
			for i := 0; i < tc.replicas; i++ {
				r, _ := x.Register(fmt.Sprintf("r%d", i))
				n := tc.tokens * (i + 1) / tc.replicas / 16 * 16
				hs := make([]uint64, n/16)
				for j := range hs {
					hs[j] = uint64(i)<<32 | uint64(j+1)
				}
				x.Apply(r, batchOf(storedEv(0, false, 16, prompt[:n], hs...)))
			}
			out := make([]int, tc.replicas)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				x.Overlap(keys, out)
			}
		})
	}
}

func BenchmarkApply(b *testing.B) {
	x := New(Config{BlockSize: 16, MaxEntries: 1 << 16})
	r, _ := x.Register("a")
	prompt := seqTokens(0, 16*32)
	hs := make([]uint64, 32)
	b.ReportAllocs()
	b.SetBytes(int64(len(prompt) * 4))
	i := uint64(0)
	for b.Loop() {
		for j := range hs {
			i++
			hs[j] = i
		}
		x.Apply(r, batchOf(storedEv(0, false, 16, prompt, hs...)))
	}
}
