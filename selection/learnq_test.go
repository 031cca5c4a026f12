package selection

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// learnQueueStep drives one random step of a request sequence through rt:
// a Route of a prompt of some family and length, then (at random) its
// engine's answer (Observe) and its release, an earlier reservation's
// release, a capacity change or a Forget. The same rng sequence gives the
// same calls on every Router.
type learnQueueRun struct {
	rt    *Router
	cands []Candidate
	sc    *Scratch
	store []Reservation // reused storage, as the module's request state is
	live  []*Reservation
	log   []Decision
}

func (r *learnQueueRun) step(t *testing.T, rng *rand.Rand, fams [][]uint64, i int) {
	fam := fams[rng.IntN(len(fams))]
	n := 1 + rng.IntN(len(fam))
	f := features(r.rt.Config(), fam[:n], 0)
	for k := range r.cands {
		r.cands[k].Usable = rng.IntN(8) != 0
	}
	res := &r.store[i%len(r.store)]
	for _, l := range r.live {
		if l == res {
			res = nil // still live: let Route allocate
			break
		}
	}
	d, got := r.rt.Route(f, r.cands, r.sc, nil, res)
	r.log = append(r.log, d)
	if got == nil {
		return
	}
	switch rng.IntN(4) {
	case 0: // the engine held nothing
		r.rt.Observe(got, 0, 0, 0)
	case 1: // the engine held all of it
		r.rt.Observe(got, 0, f.PromptTokens(r.rt.Config()), 0)
	case 2: // some of it
		r.rt.Observe(got, 0, rng.IntN(f.PromptTokens(r.rt.Config())+1), 0)
	}
	r.live = append(r.live, got)
	if len(r.live) > 6 || rng.IntN(3) == 0 {
		j := rng.IntN(len(r.live))
		r.live[j].Release()
		r.live = append(r.live[:j], r.live[j+1:]...)
	}
	switch rng.IntN(64) {
	case 0:
		r.rt.Forget(r.cands[rng.IntN(len(r.cands))].Slot)
	case 1:
		r.rt.SetCapacity(r.cands[rng.IntN(len(r.cands))].Slot, int64(rng.IntN(4))*4096)
	}
}

// The learn queue changes when and where a learn is done, never what any
// decision or belief is: the same request sequence routes identically with
// learns inline and queued (every prompt queued, or only long ones), and
// the index ends in the same state.
func TestLearnQueueRoutesIdentically(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 512, KVCapacity: 16 * 3000, IndexBudget: 64 << 10}
	fams := make([][]uint64, 24)
	for i := range fams {
		fams[i] = blocksOf(uint64(i+1), 64+i*19)
	}
	const steps = 4000
	runs := make([]*learnQueueRun, 3)
	for k, queueMin := range []int{0, 1, 100} {
		rt, cands := newTestRouter(t, c, 8)
		rt.Index().SetLearnQueue(queueMin)
		r := &learnQueueRun{rt: rt, cands: cands, sc: NewScratch(8), store: make([]Reservation, 5)}
		rng := rand.New(rand.NewPCG(7, 11))
		for i := range steps {
			r.step(t, rng, fams, i)
		}
		runs[k] = r
	}
	queued, inline := runs[1].rt.Index().QueuedLearns()
	if queued < steps/2 || inline != 0 {
		t.Fatalf("queue min 1: %d learns queued, %d inline: the queue was not exercised", queued, inline)
	}
	if q, _ := runs[0].rt.Index().QueuedLearns(); q != 0 {
		t.Fatalf("queue off: %d learns queued", q)
	}
	base := runs[0]
	for k, r := range runs[1:] {
		for i, d := range r.log {
			if d != base.log[i] {
				t.Fatalf("run %d, request %d: decided %+v, inline learns decided %+v", k+1, i, d, base.log[i])
			}
		}
		x, bx := r.rt.Index(), base.rt.Index()
		if x.Entries() != bx.Entries() || x.Pairs() != bx.Pairs() || x.Evictions() != bx.Evictions() || x.Dropped() != bx.Dropped() {
			t.Fatalf("run %d: index entries/pairs/evictions/dropped %d %d %d %d, inline %d %d %d %d", k+1,
				x.Entries(), x.Pairs(), x.Evictions(), x.Dropped(), bx.Entries(), bx.Pairs(), bx.Evictions(), bx.Dropped())
		}
		for _, cd := range r.cands {
			if x.Held(cd.Slot) != bx.Held(cd.Slot) || x.Horizon(cd.Slot) != bx.Horizon(cd.Slot) {
				t.Fatalf("run %d, slot %d: held %d horizon %d, inline %d %d", k+1, cd.Slot,
					x.Held(cd.Slot), x.Horizon(cd.Slot), bx.Held(cd.Slot), bx.Horizon(cd.Slot))
			}
		}
		if bx.Dropped() == 0 || bx.Evictions() == 0 {
			t.Fatalf("the sequence never dropped (%d) or evicted (%d): it tests too little", bx.Dropped(), bx.Evictions())
		}
	}
}

// Many goroutines routing, observing and releasing with the queue on (run
// with -race): every queued learn is applied, and the applier goroutine
// ends once the queue is empty.
func TestLearnQueueConcurrent(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 512, IndexBudget: 2000 * entryBytes}
	rt, cands := newTestRouter(t, c, 8)
	rt.Index().SetLearnQueue(1)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := NewScratch(len(cands))
			var res Reservation
			for i := range 300 {
				f := features(c, blocksOf(uint64(g*7+i%5+1), 32+i%50), 0)
				_, r := rt.Route(f, cands, sc, nil, &res)
				rt.Observe(r, 0, i%3*16, 0)
				r.Release()
			}
		}()
	}
	wg.Wait()
	// Prompts the chosen replica already held whole are learned inline.
	queued, inline := rt.Index().QueuedLearns()
	if queued+inline > 8*300 || queued < 8*300/2 {
		t.Fatalf("%d queued + %d inline learns of %d: the queue was not exercised", queued, inline, 8*300)
	}
	x := rt.Index()
	x.settle()
	if w := x.q.waiting.Load(); w != 0 {
		t.Fatalf("%d learns still waiting after settle", w)
	}
	// The applier may still be between its last batch and its exit.
	deadline := time.Now().Add(20 * time.Second)
	for {
		x.q.mu.Lock()
		running := x.q.running
		x.q.mu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the applier goroutine outlived the queue")
		}
		runtime.Gosched()
	}
}

// A queued learn allocates nothing once the queue's buffers have grown.
func TestLearnQueueRouteDoesNotAllocate(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 8)
	rt.Index().SetLearnQueue(1)
	prompt := blocksOf(1, 1024)
	f := features(rt.Config(), prompt, 300)
	s := NewScratch(8)
	var res Reservation
	route := func() {
		_, got := rt.Route(f, cands, s, nil, &res)
		rt.Observe(got, 0, 0, 0)
		got.Release()
	}
	for range 50 {
		route()
	}
	if allocs := testing.AllocsPerRun(200, route); allocs != 0 {
		t.Fatalf("Route with a queued learn allocates %v times per decision", allocs)
	}
	if q, _ := rt.Index().QueuedLearns(); q == 0 {
		t.Fatal("nothing was queued")
	}
}

// TestReservationSettled: a reservation is settled (its storage may be
// reused by a caller that pools it) only once released and once no queued
// learn will write into it; one never reserved is settled.
func TestReservationSettled(t *testing.T) {
	var res Reservation
	if !res.Settled() {
		t.Fatal("a reservation never reserved is not settled")
	}
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 512}, 4)
	rt.Index().SetLearnQueue(1) // every learn queued
	f := features(rt.Config(), blocksOf(1, 64), 0)
	_, got := rt.Route(f, cands, NewScratch(4), nil, &res)
	if got != &res {
		t.Fatalf("Route reserved into %p, want the given storage %p", got, &res)
	}
	if res.Settled() {
		t.Fatal("a reservation in flight is settled")
	}
	res.Release()
	res.learned.pending.Store(true) // a queued learn not yet applied
	if res.Settled() {
		t.Fatal("a released reservation with its learn still queued is settled")
	}
	res.learned.pending.Store(false)
	deadline := time.Now().Add(30 * time.Second)
	for !res.Settled() {
		if time.Now().After(deadline) {
			t.Fatal("the released reservation never settled")
		}
		runtime.Gosched()
	}
}
