package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// indexModel is the approximate index's semantics without its data
// structures: per replica an LRU list of (block, stamp), most recent
// first, and the global LRU list of blocks. It has no memory budget (the
// test gives the Index one it never reaches).
type indexModel struct {
	global []uint64
	reps   map[Slot]*modelRep
	drops  uint64
}

type modelRep struct {
	list              []modelPair // most recent first
	clock             int64
	capacity, horizon int64
}

type modelPair struct {
	key   uint64
	stamp int64
}

func newIndexModel() *indexModel { return &indexModel{reps: map[Slot]*modelRep{}} }

func (m *indexModel) rep(s Slot) *modelRep {
	r := m.reps[s]
	if r == nil {
		r = &modelRep{}
		m.reps[s] = r
	}
	return r
}

func (m *indexModel) held(key uint64) bool {
	for _, r := range m.reps {
		for _, p := range r.list {
			if p.key == key {
				return true
			}
		}
	}
	return false
}

func (m *indexModel) touch(key uint64, s Slot) {
	r := m.rep(s)
	r.clock++
	if i := slices.Index(m.global, key); i >= 0 {
		m.global = slices.Delete(m.global, i, i+1)
	}
	m.global = slices.Insert(m.global, 0, key)
	r.list = slices.DeleteFunc(r.list, func(p modelPair) bool { return p.key == key })
	r.list = slices.Insert(r.list, 0, modelPair{key, r.clock})
}

func (m *indexModel) dropTail(s Slot, count bool) {
	r := m.rep(s)
	key := r.list[len(r.list)-1].key
	r.list = r.list[:len(r.list)-1]
	if !m.held(key) {
		m.global = slices.DeleteFunc(m.global, func(k uint64) bool { return k == key })
	}
	if count {
		m.drops++
	}
}

func (m *indexModel) bound(s Slot) {
	r := m.rep(s)
	for r.capacity > 0 && int64(len(r.list)) > r.capacity {
		m.dropTail(s, true)
	}
	for r.horizon > 0 && len(r.list) > 0 && r.clock-r.list[len(r.list)-1].stamp >= r.horizon {
		m.dropTail(s, true)
	}
}

func (m *indexModel) learn(blocks []uint64, s Slot, probe int) int64 {
	if len(blocks) == 0 {
		return -1
	}
	r := m.rep(s)
	age := int64(-1)
	if probe > 0 && probe <= len(blocks) {
		for _, p := range r.list {
			if p.key == blocks[probe-1] {
				age = r.clock - p.stamp
			}
		}
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		m.touch(blocks[i], s)
	}
	m.bound(s)
	return age
}

func (m *indexModel) forget(s Slot) {
	r := m.rep(s)
	for len(r.list) > 0 {
		// Index.forget drops from the head; the end state is the same.
		m.dropTail(s, false)
	}
}

// state is what the index believes, in the model's terms.
func (x *Index) state(slots int) (global []uint64, reps [][]modelPair) {
	for e := x.head; e != 0; e = x.blocks[e-1].next {
		global = append(global, x.blocks[e-1].key)
	}
	reps = make([][]modelPair, slots)
	for s := 0; s < slots && s < len(x.reps); s++ {
		for e := x.reps[s].head; e != 0; e = x.pairs[e-1].next {
			p := &x.pairs[e-1]
			reps[s] = append(reps[s], modelPair{x.blocks[p.blk-1].key, p.stamp})
		}
	}
	return global, reps
}

// checkTables verifies the index's internal invariants: every live block
// is in the block table, every live pair but its block's hint is in the
// pair table (and no hint is), holder sets and counts agree with the
// pairs.
func (x *Index) checkTables() error {
	blocks, pairs, ghosts := 0, 0, 0
	for i := range x.blocks {
		b := &x.blocks[i]
		if b.pairs == 0 {
			continue
		}
		if _, e := x.findEntry(b.key); e != uint32(i+1) {
			return fmt.Errorf("block %x: table finds entry %d, want %d", b.key, e, i+1)
		}
		if b.pairs == ghost {
			ghosts++
			if x.findBlock(b.key) != 0 || b.hint != 0 || x.holders(b.key) != nil {
				return fmt.Errorf("ghost %x: found, or a hint", b.key)
			}
			for _, v := range x.bits[i*x.w : (i+1)*x.w] {
				if v != 0 {
					return fmt.Errorf("ghost %x: holder bits %x", b.key, v)
				}
			}
			continue
		}
		blocks++
		if e := x.findBlock(b.key); e != uint32(i+1) {
			return fmt.Errorf("block %x: findBlock finds %d, want %d", b.key, e, i+1)
		}
		n := 0
		for _, v := range x.bits[i*x.w : (i+1)*x.w] {
			for ; v != 0; v &= v - 1 {
				n++
			}
		}
		if n != int(b.pairs) {
			return fmt.Errorf("block %x: %d holder bits, %d pairs", b.key, n, b.pairs)
		}
		if b.hint != 0 && x.pairs[b.hint-1].blk != uint32(i+1) {
			return fmt.Errorf("block %x: hint %d is another block's pair", b.key, b.hint)
		}
	}
	m := uint64(len(x.btab) - 1)
	for h, v := range x.btab {
		if v == 0 {
			continue
		}
		e := v & x.bmask
		home, fp := x.bhash(x.blocks[e-1].key)
		d := (uint64(h) - home) & m
		if want := x.bentry(e, fp, d); v != want {
			return fmt.Errorf("table position %d: entry %#x, want %#x (displacement %d)", h, v, want, d)
		}
	}
	for i := range x.pairs {
		p := &x.pairs[i]
		if p.blk == 0 {
			continue
		}
		pairs++
		e := uint32(i + 1)
		hint := x.blocks[p.blk-1].hint == e
		_, inTab := x.findPair(p.blk, p.slot)
		switch {
		case hint && inTab != 0:
			return fmt.Errorf("pair %d is its block's hint and in the pair table", e)
		case !hint && inTab != e:
			return fmt.Errorf("pair %d: not its block's hint and the table finds %d", e, inTab)
		}
		if got := x.pairOf(p.blk, p.slot); got != e {
			return fmt.Errorf("pair %d: pairOf finds %d", e, got)
		}
		if !hasBit(x.bits[int(p.blk-1)*x.w:int(p.blk)*x.w], p.slot) {
			return fmt.Errorf("pair %d: holder bit clear", e)
		}
	}
	n := 0
	for e := x.ghead; e != 0; e = x.blocks[e-1].next {
		if x.blocks[e-1].pairs != ghost {
			return fmt.Errorf("block %d on the ghost list is no ghost", e)
		}
		n++
	}
	if n != ghosts || n != x.ghosts {
		return fmt.Errorf("%d ghosts, %d on the ghost list, %d counted", ghosts, n, x.ghosts)
	}
	if int64(blocks) != x.Entries() || int64(pairs) != x.Pairs() {
		return fmt.Errorf("%d blocks, %d pairs; counted %d, %d", blocks, pairs, x.Entries(), x.Pairs())
	}
	return nil
}

// The index's learn, bounds and forget against the model, over random
// prompts that share prefixes, repeat blocks and grow conversations, on
// slots past 64 (holder sets of two words).
func TestIndexMatchesModel(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			x := NewIndex(1 << 30)
			untagged := seed > 4
			if untagged {
				// The table of a slab too large for tagged entries.
				x.growBlocks(1 << 16)
				x.bmask = ^uint32(0)
			}
			m := newIndexModel()
			const slots = 70
			var prompts [][]uint64
			var lastSlot Slot
			for op := 0; op < 3000; op++ {
				s := Slot(r.IntN(slots))
				if seed%2 == 0 {
					s = Slot(r.IntN(4)) // few replicas: long, warm lists
				}
				switch k := r.IntN(100); {
				case k < 3:
					c := int64(r.IntN(60))
					x.SetCapacity(s, c)
					m.rep(s).capacity = c
					m.bound(s)
				case k < 6:
					h := int64(r.IntN(200))
					x.SetHorizon(s, h)
					m.rep(s).horizon = h
					m.bound(s)
				case k < 7:
					x.Forget(s)
					m.forget(s)
				case k < 10 && len(prompts) > 0:
					// The last prompt again, on the slot it went to.
					p := prompts[len(prompts)-1]
					if got, want := x.learn(p, lastSlot, 1), m.learn(p, lastSlot, 1); got != want {
						t.Fatalf("op %d: learn age %d, model %d", op, got, want)
					}
				default:
					var p []uint64
					switch {
					case len(prompts) > 0 && k < 50:
						// Resend or extend an earlier prompt.
						p = slices.Clone(prompts[r.IntN(len(prompts))])
						if r.IntN(2) == 0 {
							p = p[:r.IntN(len(p)+1)]
						}
						for range r.IntN(20) {
							p = append(p, r.Uint64N(1<<20))
						}
					default:
						for range r.IntN(80) {
							p = append(p, r.Uint64N(300)) // repeats within and across prompts
						}
					}
					prompts = append(prompts, p)
					lastSlot = s
					probe := r.IntN(len(p) + 2)
					got, want := x.learn(p, s, probe), m.learn(p, s, probe)
					if got != want {
						t.Fatalf("op %d: learn age %d, model %d", op, got, want)
					}
				}
				if op%20 != 0 && op != 2999 {
					continue
				}
				g, reps := x.state(slots)
				if mg := m.global; !slices.Equal(g, mg) {
					t.Fatalf("op %d: global LRU differs:\n got %v\nwant %v", op, g, mg)
				}
				for s := range Slot(slots) {
					var want []modelPair
					if mr := m.reps[s]; mr != nil {
						want = mr.list
					}
					if !slices.Equal(reps[s], want) {
						t.Fatalf("op %d slot %d: beliefs differ:\n got %v\nwant %v", op, s, reps[s], want)
					}
				}
				if x.Dropped() != m.drops {
					t.Fatalf("op %d: dropped %d, model %d", op, x.Dropped(), m.drops)
				}
				if op%200 == 0 {
					if err := x.checkTables(); err != nil {
						t.Fatalf("op %d: %v", op, err)
					}
				}
			}
			if err := x.checkTables(); err != nil {
				t.Fatal(err)
			}
			if untagged && x.bmask != ^uint32(0) {
				t.Fatal("the slab grew: the untagged table was not exercised to the end")
			}
		})
	}
}

// Under small budgets (evictions while learning, slabs growing by
// eighths: a table rebuilt at the same size) the tables stay consistent.
func TestIndexTablesUnderBudget(t *testing.T) {
	for budget := int64(40 << 10); budget <= 200<<10; budget += 8 << 10 {
		r := rand.New(rand.NewPCG(3, uint64(budget)))
		x := NewIndex(budget)
		for op := 0; op < 1500; op++ {
			p := make([]uint64, r.IntN(120))
			base := r.Uint64N(50) << 20
			for i := range p {
				p[i] = base + uint64(i)
			}
			x.learn(p, Slot(r.IntN(70)), 1)
			if op%50 == 0 {
				if err := x.checkTables(); err != nil {
					t.Fatalf("budget %d op %d: %v", budget, op, err)
				}
			}
		}
		if x.Evictions() == 0 {
			t.Fatalf("budget %d never evicted", budget)
		}
		if err := x.checkTables(); err != nil {
			t.Fatal(err)
		}
	}
}
