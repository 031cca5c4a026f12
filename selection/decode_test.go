package selection

import (
	"testing"
	"time"
)

// routeResident routes a prompt of n blocks of family fam to the only
// usable candidate i, so that its tokens stay resident there until res is
// released.
func routeResident(t *testing.T, rt *Router, cands []Candidate, i int, fam uint64, n int) *Reservation {
	t.Helper()
	only := make([]Candidate, len(cands))
	copy(only, cands)
	for k := range only {
		only[k].Usable = k == i
	}
	d, res := rt.Route(features(rt.Config(), blocksOf(fam, n), 0), only, NewScratch(len(only)), nil, nil)
	if d.Index != i || res == nil {
		t.Fatalf("routing to candidate %d: %+v", i, d)
	}
	res.PrefillDone()
	return res
}

func TestPairWeightLoad(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
	rt = rt.WithOptions(Options{PairFloor: -1}) // the arithmetic at 16,000 tokens, below DefaultPairFloor
	sl := cands[0].Slot
	rt.SetCapacity(sl, 16_000)
	res := routeResident(t, rt, cands, 0, 1, 250) // 4,000 tokens resident
	defer res.Release()
	// request_cost + 2 x P x 4,000 / 16,000
	for _, tt := range []struct {
		prompt int
		want   float64
	}{{0, 1}, {100, 1 + 50}, {8000, 1 + 4000}} {
		if got := rt.load(sl, tt.prompt); got != tt.want {
			t.Errorf("load for a %d-token prompt = %v, want %v", tt.prompt, got, tt.want)
		}
	}
}

// A released request's context keeps counting in the pair term until a
// request at least as long is reserved on the replica (a closed-loop agent
// between turns); its own next turn takes it off, and NoLinger is the rule
// before.
func TestPairWeightLingers(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
	rt = rt.WithOptions(Options{PairFloor: -1}) // the arithmetic at 16,000 tokens, below DefaultPairFloor
	sl := cands[0].Slot
	rt.SetCapacity(sl, 16_000)
	routeResident(t, rt, cands, 0, 1, 250).Release() // 4,000 tokens, ended
	if got, want := rt.load(sl, 8000), 2*8000*4000/16000.0; got != want {
		t.Errorf("load after release = %v, want %v (the context lingers)", got, want)
	}
	// A 1,600-token request takes 1,600 of the 4,000 off while it runs.
	res := routeResident(t, rt, cands, 0, 2, 100)
	if got, want := rt.load(sl, 8000), 1+2*8000*(1600+2400)/16000.0; got != want {
		t.Errorf("load with a short request in flight = %v, want %v", got, want)
	}
	res.Release()
	// The next turn (longer than what lingers) takes it all off.
	res = routeResident(t, rt, cands, 0, 1, 300)
	if got, want := rt.load(sl, 8000), 1+2*8000*4800/16000.0; got != want {
		t.Errorf("load with the next turn in flight = %v, want %v", got, want)
	}
	res.Release()
	// Lingering context is capped at the replica's capacity.
	for range 5 {
		routeResident(t, rt, cands, 0, 3, 1000).Release() // 16,000 tokens each
	}
	if got, want := rt.load(sl, 8000), 2*8000.0; got != want {
		t.Errorf("load with more than the capacity released = %v, want %v", got, want)
	}

	before, cands2 := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
	before = before.WithOptions(Options{NoLinger: true, PairFloor: -1})
	routeResident(t, before, cands2, 0, 1, 250).Release()
	if got := before.load(cands2[0].Slot, 8000); got != 0 {
		t.Errorf("NoLinger: load after release = %v, want 0", got)
	}
}

// Released context stops counting once nothing was released on its
// replica for the linger TTL (the rounds of a burst are done; an agent
// between turns is back within seconds), and a release after that starts
// the count over; a negative TTL never expires.
func TestPairWeightLingerExpires(t *testing.T) {
	var now time.Duration
	clock := func() time.Duration { return now }
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
	rt = rt.WithOptions(Options{PairFloor: -1}) // the arithmetic at 16,000 tokens, below DefaultPairFloor
	rt.SetClock(clock)
	sl := cands[0].Slot
	rt.SetCapacity(sl, 16_000)
	routeResident(t, rt, cands, 0, 1, 250).Release() // 4,000 tokens, ended at 0
	now = DefaultLingerTTL - time.Millisecond
	if got, want := rt.load(sl, 8000), 2*8000*4000/16000.0; got != want {
		t.Errorf("load just before the TTL = %v, want %v (the context lingers)", got, want)
	}
	now = DefaultLingerTTL
	if got := rt.load(sl, 8000); got != 0 {
		t.Errorf("load at the TTL = %v, want 0 (the context expired)", got)
	}
	// A release past the TTL starts over: only its own context lingers.
	routeResident(t, rt, cands, 0, 2, 100).Release() // 1,600 tokens
	if got, want := rt.load(sl, 8000), 2*8000*1600/16000.0; got != want {
		t.Errorf("load after a release past the TTL = %v, want %v", got, want)
	}
	// A release within the TTL refreshes what lingers on the replica (the
	// reservation took its 1,600 tokens off, its release put them back).
	now += DefaultLingerTTL / 2
	routeResident(t, rt, cands, 0, 3, 100).Release()
	now += DefaultLingerTTL/2 + time.Millisecond
	if got, want := rt.load(sl, 8000), 2*8000*1600/16000.0; got != want {
		t.Errorf("load after a refreshing release = %v, want %v", got, want)
	}

	forever, cands2 := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
	forever = forever.WithOptions(Options{LingerTTL: -1, PairFloor: -1})
	forever.SetClock(clock)
	forever.SetCapacity(cands2[0].Slot, 16_000)
	now = 0
	routeResident(t, forever, cands2, 0, 1, 250).Release()
	now = time.Hour
	if got, want := forever.load(cands2[0].Slot, 8000), 2*8000*4000/16000.0; got != want {
		t.Errorf("LingerTTL < 0: load an hour after release = %v, want %v", got, want)
	}
}

func TestOverflowWeightLoad(t *testing.T) {
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, Explicit: KnobPairWeight}, 2)
	rt := rt0.WithOptions(Options{OverflowWeight: 3})
	sl := cands[0].Slot
	rt.SetCapacity(sl, 10_000)
	res := routeResident(t, rt, cands, 0, 1, 500) // 8,000 tokens resident
	// Below the capacity nothing is added; past it, 3 per missing token.
	if got := rt.load(sl, 2000); got != 1 {
		t.Errorf("load for a prompt that fits = %v, want 1", got)
	}
	if got := rt.load(sl, 2500); got != 1+3*500 {
		t.Errorf("load for a prompt 500 tokens past the capacity = %v, want %v", got, 1+3*500)
	}
	// Engine-reported KV of others counts as resident.
	rt.SetExternalLoad(sl, 0, 0, 1000)
	if got := rt.load(sl, 2000); got != 1+3*1000 {
		t.Errorf("load with 1,000 external KV tokens = %v, want %v", got, 1+3*1000)
	}
	rt.SetExternalLoad(sl, 0, 0, 0)
	res.Release()
	if got := rt.load(sl, 9000); got != 0 {
		t.Errorf("load after release = %v, want 0", got)
	}
}

// Options.OverflowHome: a home past its capacity keeps the request (the
// overflow term skips it) when it holds at least that share of the prompt
// and its capacity is below OverflowHomeRoom times the prompt (it holds
// fewer than that many contexts of this size); with the option off, below
// the share or past the room, the request moves to the idle replica with
// room.
func TestOverflowHomeExempt(t *testing.T) {
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, Explicit: KnobPairWeight}, 2)
	for _, c := range cands {
		rt0.SetCapacity(c.Slot, 10_000)
	}
	res := routeResident(t, rt0, cands, 0, 1, 375) // 6,000 tokens in flight on replica 0
	defer res.Release()
	long := blocksOf(2, 400) // 6,400 tokens, 6,000 of them held by replica 0
	rt0.Learn(&Features{Blocks: long[:375]}, cands[0].Slot)
	s := NewScratch(2)
	for _, tt := range []struct {
		home, room float64
		want       int
		overflow   bool // replica 0's load holds 4 x (6,000 + 6,400 - 10,000)
	}{
		{-1, 0, 1, true},   // off
		{0, 0, 0, false},   // the defaults: 0.9, and 10,000 < 2.5 x 6,400
		{0.5, 0, 0, false}, //
		{0.9, 0, 0, false},
		{0.95, 0, 1, true}, // 6,000 < 0.95 x 6,400
		{0, 1.5, 1, true},  // 10,000 >= 1.5 x 6,400: room for more than this context
		{0, 1.6, 0, false}, // 10,000 < 1.6 x 6,400
		{0, -1, 0, false},  // no gate
		{0.95, -1, 1, true},
	} {
		rt := rt0.WithOptions(Options{OverflowHome: tt.home, OverflowHomeRoom: tt.room})
		d := rt.Pick(features(rt.Config(), long, 0), cands, s)
		if d.Index != tt.want {
			t.Errorf("OverflowHome %v, room %v: picked %d (loads %v), want %d", tt.home, tt.room, d.Index, s.Load, tt.want)
		}
		if got, over := s.Load[0], s.Load[0] >= DefaultOverflowWeight*2400; over != tt.overflow {
			t.Errorf("OverflowHome %v, room %v: replica 0's load %v, overflow charged %v, want %v", tt.home, tt.room, got, over, tt.overflow)
		}
	}
}

// A long request that shares only a common prefix with the warm
// replicas goes where the resident context is short, an idle cold replica
// included; a conversation stays on its home (the only replica holding
// its context) however long the context resident there; a short request
// barely feels the term.
func TestPairWeightSpreadsLongContexts(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 4}, 3)
	for _, c := range cands {
		rt.SetCapacity(c.Slot, 256_000)
	}
	shared := blocksOf(7, 1250) // a 20,000-token shared prefix
	rt.Learn(&Features{Blocks: shared}, cands[0].Slot)
	rt.Learn(&Features{Blocks: shared}, cands[1].Slot)
	var held []*Reservation
	for fam := uint64(10); fam < 13; fam++ {
		held = append(held, routeResident(t, rt, cands, 0, fam, 1000)) // 3 x 16,000 tokens
	}
	for fam := uint64(13); fam < 15; fam++ {
		held = append(held, routeResident(t, rt, cands, 1, fam, 1000)) // 2 x 16,000 tokens
	}
	defer func() {
		for _, r := range held {
			r.Release()
		}
	}()
	s := NewScratch(3)

	// 60,000 tokens, 20,000 warm on replicas 0 and 1: pair terms 4 x 60,000
	// x 48,000 / 256,000 = 45,000 and 30,000 against 20,000 of overlap.
	long := append(append([]uint64(nil), shared...), blocksOf(20, 2500)...)
	if d := rt.Pick(features(rt.Config(), long, 0), cands, s); d.Index != 2 {
		t.Fatalf("long request: %+v (loads %v), want the idle replica", d, s.Load)
	}
	off, err := rt.Retune(Config{BlockTokens: 16, RequestCost: 10, Explicit: KnobPairWeight})
	if err != nil {
		t.Fatal(err)
	}
	if d := off.Pick(features(rt.Config(), long, 0), cands, s); d.Index != 1 {
		t.Fatalf("long request without the pair term: %+v, want replica 1 (warm, least loaded)", d)
	}

	// The same prompt, its whole context held by replica 0 only: home.
	rt.Learn(&Features{Blocks: long}, cands[0].Slot)
	if d := rt.Pick(features(rt.Config(), long, 0), cands, s); d.Index != 0 || s.Load[0] != 3 {
		t.Fatalf("conversation at home: %+v (loads %v), want replica 0 with load 3", d, s.Load)
	}
	every := rt.WithOptions(Options{PairEverywhere: true})
	if every.Pick(features(rt.Config(), long, 0), cands, s); s.Load[0] != 3+45_000 {
		t.Fatalf("PairEverywhere: home load %v, want 45,003", s.Load[0])
	}

	// 992 tokens, all warm on replicas 0 and 1: 4 x 992 x 48,000 / 256,000
	// = 744 and 496 of load against 992 of overlap.
	small := shared[:62]
	if d := rt.Pick(features(rt.Config(), small, 0), cands, s); d.Index != 1 || d.Overlap != 992 {
		t.Fatalf("small request: %+v (loads %v), want warm replica 1", d, s.Load)
	}
}

// The home's exemption is from the pair term only: context_weight still
// counts there.
func TestHomeKeepsContextWeight(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 4, ContextWeight: 1}, 2)
	rt = rt.WithOptions(Options{PairFloor: -1}) // the arithmetic at 16,000 tokens, below DefaultPairFloor
	rt.SetCapacity(cands[0].Slot, 16_000)
	res := routeResident(t, rt, cands, 0, 1, 250) // 4,000 tokens resident
	defer res.Release()
	if got, want := rt.loadPair(cands[0].Slot, 8000, false, rt.lingerNow(), -1), 1+4000.0*4000/16000; got != want {
		t.Fatalf("home load = %v, want %v (request_cost + context term)", got, want)
	}
	if got, want := rt.loadPair(cands[0].Slot, 8000, true, rt.lingerNow(), -1), 1+4000.0*4000/16000+4*8000.0*4000/16000; got != want {
		t.Fatalf("load = %v, want %v", got, want)
	}
}

// The pair term's bounds: the capacity floor in its denominator (the
// rule: DefaultPairFloor), and two experiments, a cap at a fraction of the
// request's deepest overlap and the same cap on its lingering part only.
func TestPairBounds(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 4}, 2)
	var now time.Duration
	rt.SetClock(func() time.Duration { return now })
	sl := cands[0].Slot
	rt.SetCapacity(sl, 16_000)
	res := routeResident(t, rt, cands, 0, 1, 250) // 4,000 tokens resident
	// 4 x 8,000 x 4,000 / 16,000 = 8,000 of pair term.
	for _, tt := range []struct {
		name string
		o    Options
		hit  int
		want float64
	}{
		{"rule: the default floor", Options{}, 1000, 1 + 4*8000*4000.0/DefaultPairFloor},
		{"no floor", Options{PairFloor: -1}, 1000, 1 + 8000},
		{"floor", Options{PairFloor: 64_000}, 1000, 1 + 2000},
		{"floor below the capacity", Options{PairFloor: 8_000}, 1000, 1 + 8000},
		{"cap", Options{PairFloor: -1, PairCap: 0.5}, 1000, 1 + 500},
		{"cap, not binding", Options{PairFloor: -1, PairCap: 0.5}, 20_000, 1 + 8000},
		{"cap, cold request", Options{PairFloor: -1, PairCap: 0.5}, 0, 1 + 8000},
		{"linger cap, nothing lingering", Options{PairFloor: -1, LingerCap: 0.5}, 1000, 1 + 8000},
	} {
		if got := rt.WithOptions(tt.o).loadPair(sl, 8000, true, 0, tt.hit); got != tt.want {
			t.Errorf("%s: load %v, want %v", tt.name, got, tt.want)
		}
	}
	res.Release() // 4,000 tokens linger, nothing resident
	nf := rt.WithOptions(Options{PairFloor: -1})
	if got := nf.loadPair(sl, 8000, true, 0, 1000); got != 8000 {
		t.Fatalf("lingering: load %v, want 8,000", got)
	}
	if got, want := rt.loadPair(sl, 8000, true, 0, 1000), 4*8000*4000.0/DefaultPairFloor; got != want {
		t.Fatalf("lingering, the default floor: load %v, want %v", got, want)
	}
	// On a replica at least DefaultPairFloor large the floor changes nothing.
	rt.SetCapacity(sl, 2*DefaultPairFloor)
	if got, want := rt.loadPair(sl, 8000, true, 0, 1000), nf.loadPair(sl, 8000, true, 0, 1000); got != want || got != 4*8000*4000.0/(2*DefaultPairFloor) {
		t.Fatalf("above the floor: load %v, want %v as without it", got, want)
	}
	rt.SetCapacity(sl, 16_000)
	lc := rt.WithOptions(Options{PairFloor: -1, LingerCap: 0.25})
	if got := lc.loadPair(sl, 8000, true, 0, 1000); got != 250 {
		t.Fatalf("LingerCap: load %v, want 250", got)
	}
	if got := lc.loadPair(sl, 8000, true, 0, -1); got != 8000 {
		t.Fatalf("LingerCap, no overlap known: load %v, want 8,000", got)
	}
}

// With LingerHalfLife the lingering context halves every half-life
// since the replica's last release instead of expiring at once.
func TestLingerHalfLife(t *testing.T) {
	var now time.Duration
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 1, PairWeight: 2}, 2)
	rt = rt.WithOptions(Options{PairFloor: -1, LingerHalfLife: 10 * time.Second})
	rt.SetClock(func() time.Duration { return now })
	sl := cands[0].Slot
	rt.SetCapacity(sl, 16_000)
	routeResident(t, rt, cands, 0, 1, 250).Release() // 4,000 tokens, ended at 0
	for _, tt := range []struct {
		at   time.Duration
		want float64
	}{{0, 4000}, {10 * time.Second, 2000}, {DefaultLingerTTL, 1000}} {
		now = tt.at
		if got, want := rt.load(sl, 8000), 2*8000*tt.want/16000; got != want {
			t.Errorf("load %v after the release = %v, want %v (%v tokens linger)", tt.at, got, want, tt.want)
		}
	}
}
