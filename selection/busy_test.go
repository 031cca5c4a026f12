package selection

import "testing"

// TestBusyGuard checks Options.HotGuard's term: request_cost once more for
// each in-flight request past HotGuard times the usable replicas' mean
// (a mean of at least one), and that it turns a warm replica's win into
// a spill to an idle one.
func TestBusyGuard(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024, AffinityCap: 1000, Alpha: 1, RequestCost: 100}
	rt, cands := newTestRouter(t, c, 4)
	c = rt.Config()
	s := NewScratch(4)
	f := features(c, blocksOf(3, 200), 0) // 3200 tokens, overlap capped at 1000
	rt.Learn(f, cands[0].Slot)
	off := rt.WithOptions(Options{HotGuard: -1})

	var rs []*Reservation
	reserve := func(i, n int) {
		for range n {
			rs = append(rs, rt.Reserve(cands[i].Slot, 0))
		}
	}
	// An idle fleet: the mean is floored at one request, so the limit is
	// 2 (DefaultHotGuard): 2 in flight pay nothing more, 3 pay once.
	reserve(0, 2)
	rt.Pick(f, cands, s)
	if s.Load[0] != 200 {
		t.Fatalf("2 in flight on an idle fleet: load %v, want 200", s.Load[0])
	}
	reserve(0, 1)
	rt.Pick(f, cands, s)
	if s.Load[0] != 400 {
		t.Fatalf("3 in flight on an idle fleet: load %v, want 300 + 100", s.Load[0])
	}
	// 9 on the warm replica, 1 on another: mean 2.5, limit 5, so
	// 9 x 100 + 4 x 100. Without the guard the warm replica still wins
	// (1000 - 900 = 100 against an idle replica's 0); with it (1000 -
	// 1300), an idle replica does.
	reserve(0, 6)
	reserve(1, 1)
	d := rt.Pick(f, cands, s)
	if s.Load[0] != 1300 || s.Load[1] != 100 {
		t.Fatalf("loads %v, want [1300 100 0 0]", s.Load)
	}
	if d.Index == 0 || d.Reason != ReasonLoadOverride {
		t.Fatalf("with the guard: %+v, want a spill off the busy warm replica", d)
	}
	if d = off.Pick(f, cands, s); d.Index != 0 || s.Load[0] != 900 || d.Score != 100 {
		t.Fatalf("without the guard: %+v loads %v, want the warm replica at load 900", d, s.Load)
	}
	// A guard of 4: limit 10, nothing added.
	if rt.WithOptions(Options{HotGuard: 4}).Pick(f, cands, s); s.Load[0] != 900 {
		t.Fatalf("HotGuard 4: load %v, want 900", s.Load[0])
	}
	// Unusable replicas do not count in the mean: with only the busy one
	// and one idle usable, mean 4.5 (9 / 2), limit 9: nothing added.
	cands[1].Usable, cands[2].Usable = false, false
	rt.Pick(f, cands, s)
	if s.Load[0] != 900 {
		t.Fatalf("two usable: load %v, want 900", s.Load[0])
	}
	for _, r := range rs {
		r.Release()
	}
}

// subsetFleet sets up SubsetGuardReplicas replicas (cands) for the subset
// guard's and the warm hold's tests: the first 4 hold the first 416 tokens
// of the returned 3,200-token prompt and run 4 requests each, the last
// replica none, the others 3 (97 over 32, mean 3.03125). The caller
// releases the reservations: 4 per holder first, holder i's at 4i..4i+3.
func subsetFleet(rt *Router, cands []Candidate) (*Features, []*Reservation) {
	c := rt.Config()
	short := features(c, blocksOf(3, 26), 0)
	for i := range 4 {
		rt.Learn(short, cands[i].Slot)
	}
	var rs []*Reservation
	for i := range cands {
		n := 3
		switch {
		case i < 4:
			n = 4
		case i == len(cands)-1:
			n = 0
		}
		for range n {
			rs = append(rs, rt.Reserve(cands[i].Slot, 0))
		}
	}
	return features(c, blocksOf(3, 200), 0), rs
}

// TestSubsetGuard checks Options.SubsetGuard: over at least
// SubsetGuardReplicas usable replicas, a replica holding more of the
// prompt than the least warm one pays request_cost past the mean (not
// below DefaultSubsetFloor requests), so the holders of a prefix only a
// subset has shed a request to an idle replica that the busy guard alone
// leaves on them; a prefix every replica holds, a smaller fleet and
// SubsetGuard -1 leave the busy guard alone.
func TestSubsetGuard(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024, AffinityCap: 1000, Alpha: 1, RequestCost: 100}
	rt, cands := newTestRouter(t, c, SubsetGuardReplicas)
	// The guard's spill alone: the warm hold (TestWarmHold) would take
	// it back to a holder running under 1.5 times the mean.
	rt = rt.WithOptions(Options{WarmHold: -1})
	c = rt.Config()
	s := NewScratch(len(cands))
	// The busy guard's limit (6.0625) charges nobody; the subset guard's
	// (3.03125) charges each holder 96.875.
	f, rs := subsetFleet(rt, cands)
	short := features(c, blocksOf(3, 26), 0) // the holders' prefix
	defer func() {
		for _, r := range rs {
			r.Release()
		}
	}()
	idle := len(cands) - 1
	d := rt.Pick(f, cands, s)
	if s.Load[0] != 496.875 || s.Load[4] != 300 || d.Index != idle || d.Reason != ReasonLoadOverride {
		t.Fatalf("subset guard: %+v, loads %v, want holders at 496.875 and a spill to the idle replica", d, s.Load[:6])
	}
	if d = rt.WithOptions(Options{SubsetGuard: -1}).Pick(f, cands, s); d.Index >= 4 || s.Load[0] != 400 || d.Score != 16 {
		t.Fatalf("without the subset guard: %+v loads %v, want a holder at load 400 (416 - 400)", d, s.Load[:6])
	}
	// A floor of 5 requests: the holders' 4 pay nothing.
	if d = rt.WithOptions(Options{SubsetFloor: 5}).Pick(f, cands, s); d.Index >= 4 || s.Load[0] != 400 {
		t.Fatalf("SubsetFloor 5: %+v loads %v, want a holder at load 400", d, s.Load[:6])
	}
	// One replica fewer usable (a non-holder running 3): 94 over 31,
	// below SubsetGuardReplicas, so the busy guard alone (limit 6.06).
	cands[5].Usable = false
	if d = rt.Pick(f, cands, s); d.Index >= 4 || s.Load[0] != 400 {
		t.Fatalf("%d usable: %+v loads %v, want a holder at load 400", len(cands)-1, d, s.Load[:6])
	}
	cands[5].Usable = true
	// Every replica holds the prefix: nobody holds more than the least
	// warm, nobody pays.
	for i := range cands {
		rt.Learn(short, cands[i].Slot)
	}
	if d = rt.Pick(f, cands, s); s.Load[0] != 400 || d.Index != idle {
		t.Fatalf("prefix held by all: %+v loads %v, want holders at 400 and the idle replica", d, s.Load[:6])
	}
}

// TestWarmHold checks Options.WarmHold: over at least SubsetGuardReplicas
// usable replicas, a load override to a replica that holds none of the
// prompt goes back to the best-scoring holder that runs fewer than
// WarmHold times the mean and whose pending prefill less its overlap is
// at most the cold replica's; a holder past either limit, a prompt longer
// than DefaultAgreeMax and WarmHold -1 leave the spill as it was (under
// SubsetGuardReplicas, the subset guard that made this spill is off too).
func TestWarmHold(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024, AffinityCap: 1000, Alpha: 1, RequestCost: 100}
	rt, cands := newTestRouter(t, c, SubsetGuardReplicas)
	c = rt.Config()
	s := NewScratch(len(cands))
	// TestSubsetGuard's fleet: the subset guard makes the idle replica the
	// best score (416 - 496.875 < 0).
	f, rs := subsetFleet(rt, cands)
	defer func() {
		for _, r := range rs {
			r.Release()
		}
	}()
	idle := len(cands) - 1
	if d := rt.WithOptions(Options{WarmHold: -1}).Pick(f, cands, s); d.Index != idle || d.Reason != ReasonLoadOverride {
		t.Fatalf("without the hold: %+v, want the spill to the idle replica", d)
	}
	// 4 < 1.5 x 3.03125 and no queue: the holder with the best score
	// (all equal: the first) wins, an affinity decision.
	d := rt.Pick(f, cands, s)
	if d.Index != 0 || d.Overlap != 416 || d.Reason != ReasonAffinity {
		t.Fatalf("warm hold: %+v, want holder 0", d)
	}
	// A prompt longer than DefaultAgreeMax (an agent's context, the same
	// blocks): not held.
	long := *f
	long.PromptBytes = int(float64(DefaultAgreeMax+16) * c.CharsPerToken)
	if d = rt.Pick(&long, cands, s); d.Index != idle {
		t.Fatalf("a %d-token prompt: %+v, want the idle replica", long.PromptTokens(c), d)
	}
	// A limit of 1.2 x 3.03125 = 3.64: the holders' 4 are past it.
	if d = rt.WithOptions(Options{WarmHold: 1.2}).Pick(f, cands, s); d.Index != idle {
		t.Fatalf("WarmHold 1.2: %+v, want the idle replica", d)
	}
	// Holder 0 queues more prefill than its overlap (500 > 416 + 0), its
	// count unchanged (one of its 4 requests swapped for one with 500
	// pending): holder 1 wins; with every holder queued so, the idle
	// replica keeps it.
	queue := func(i int) {
		rs[4*i].Release()
		rs = append(rs, rt.Reserve(cands[i].Slot, 500))
	}
	queue(0)
	if d = rt.Pick(f, cands, s); d.Index != 1 {
		t.Fatalf("holder 0 queued: %+v, want holder 1", d)
	}
	for i := 1; i < 4; i++ {
		queue(i)
	}
	if d = rt.Pick(f, cands, s); d.Index != idle {
		t.Fatalf("every holder queued: %+v, want the idle replica", d)
	}
}

// TestWarmHoldFleetMean: the warm hold applies only on a fleet running at
// least two requests per usable replica. Two holders each run one request
// with 50,000 tokens of context (the pair term makes a replica without the
// prefix the best score); with the others running 2 each but four running 1
// (mean 1.81) the cold replica keeps the request, with all others at 3
// (mean 2.9) a holder (under 1.5x the mean, no queue) takes it.
func TestWarmHoldFleetMean(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024, AffinityCap: 1000, Alpha: 1, RequestCost: 100}
	rt, cands := newTestRouter(t, c, SubsetGuardReplicas)
	c = rt.Config()
	s := NewScratch(len(cands))
	f := features(c, blocksOf(3, 200), 0)
	short := features(c, blocksOf(3, 26), 0)
	var rs []*Reservation
	defer func() {
		for _, r := range rs {
			r.Release()
		}
	}()
	for i := range 2 {
		rt.Learn(short, cands[i].Slot)
		r := new(Reservation)
		rt.reserveInto(r, cands[i].Slot, 0, 50_000)
		rs = append(rs, r)
	}
	run := func(from, to, n int) {
		for i := from; i < to; i++ {
			for range n {
				rs = append(rs, rt.Reserve(cands[i].Slot, 0))
			}
		}
	}
	run(2, 28, 2)
	run(28, 32, 1) // 2 + 52 + 4 = 58 over 32: mean 1.8125
	if d := rt.Pick(f, cands, s); d.Overlap != 0 || d.Reason != ReasonLoadOverride {
		t.Fatalf("mean under 2: %+v, want a replica without the prefix", d)
	}
	run(2, 28, 1)
	run(28, 32, 2) // 2 + 78 + 12 = 92 over 32: mean 2.875
	if d := rt.Pick(f, cands, s); d.Index > 1 || d.Overlap != 416 {
		t.Fatalf("mean 2.875: %+v, want a holder", d)
	}
	if d := rt.WithOptions(Options{WarmHold: -1}).Pick(f, cands, s); d.Overlap != 0 {
		t.Fatalf("mean 2.875 without the hold: %+v, want a replica without the prefix", d)
	}
}

// TestWarmHoldShortestQueue: the warm hold sends the request to the holder
// with the shortest queue (pending prefill less overlap), not the best
// score. Replicas 0 and 1 hold a 416-token prefix: replica 0 runs 2
// requests with 250 tokens of prefill queued (score 416 - 450 = -34; queue
// -166), replica 1 runs 4 with none (score 416 - 400 - 100 (the subset
// guard) = -84; queue -416); replica 31 is idle (score 0, the best), the
// other 29 run 3 each (mean 93 / 32 = 2.9, the hold's limit 4.36).
func TestWarmHoldShortestQueue(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024, AffinityCap: 1000, Alpha: 1, RequestCost: 100}
	rt, cands := newTestRouter(t, c, SubsetGuardReplicas)
	c = rt.Config()
	s := NewScratch(len(cands))
	short := features(c, blocksOf(3, 26), 0)
	f := features(c, blocksOf(3, 200), 0)
	var rs []*Reservation
	defer func() {
		for _, r := range rs {
			r.Release()
		}
	}()
	run := func(i, n, prefill int) {
		for range n {
			rs = append(rs, rt.Reserve(cands[i].Slot, prefill))
		}
	}
	rt.Learn(short, cands[0].Slot)
	rt.Learn(short, cands[1].Slot)
	run(0, 1, 0)
	run(0, 1, 250)
	run(1, 4, 0)
	for i := 2; i < len(cands)-1; i++ {
		run(i, 3, 0)
	}
	if d := rt.WithOptions(Options{WarmHold: -1}).Pick(f, cands, s); d.Index != len(cands)-1 || d.Reason != ReasonLoadOverride {
		t.Fatalf("without the hold: %+v, want the idle replica", d)
	}
	if d := rt.Pick(f, cands, s); d.Index != 1 || d.Overlap != 416 {
		t.Fatalf("warm hold: %+v, want replica 1 (queue -416 against -166)", d)
	}
	// Replica 1 at 5 requests, past the limit 1.5 x 94 / 32 = 4.41: replica 0.
	run(1, 1, 0)
	if d := rt.Pick(f, cands, s); d.Index != 0 || d.Overlap != 416 {
		t.Fatalf("replica 1 over the limit: %+v, want replica 0", d)
	}
}
