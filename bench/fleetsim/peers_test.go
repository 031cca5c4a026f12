package fleetsim

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// fakeEngine is what a policy reads of an engine, set by the test.
type fakeEngine struct {
	waiting, running int
	kv               float64
}

func (f *fakeEngine) Waiting() int         { return f.waiting }
func (f *fakeEngine) Running() int         { return f.running }
func (f *fakeEngine) KVUsage() float64     { return f.kv }
func (f *fakeEngine) set(w int, k float64) { f.waiting, f.kv = w, k }

func fleetOf(n int) ([]*Replica, []*fakeEngine) {
	fl := make([]*Replica, n)
	fe := make([]*fakeEngine, n)
	for i := range fl {
		fe[i] = &fakeEngine{}
		fl[i] = &Replica{ID: i, eng: fe[i], cached: make(map[uint64]struct{})}
	}
	return fl, fe
}

// req synthesises a request of group g with prefix p and input n tokens.
func req(id, g, p, n int) *Request {
	row := workload.Request{ID: id, After: -1, Session: id, Group: g, Prefix: p, Input: n, Output: 16}
	s := workload.Synth{Salt: 1}
	return &Request{Row: row, Prompt: s.Prompt(nil, row), Output: s.Completion(nil, row)}
}

func TestRoundRobin(t *testing.T) {
	fl, _ := fleetOf(3)
	p := &RoundRobin{}
	var got []int
	for i := range 7 {
		got = append(got, p.Pick(req(i, 0, 0, 10), fl))
	}
	want := []int{0, 1, 2, 0, 1, 2, 0}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("picks %v, want %v", got, want)
		}
	}
}

func TestLeastInFlight(t *testing.T) {
	fl, _ := fleetOf(4)
	fl[0].InFlight, fl[1].InFlight, fl[2].InFlight, fl[3].InFlight = 3, 1, 2, 1
	p := &LeastInFlight{rng: rand.New(rand.NewPCG(1, 2))}
	seen := map[int]bool{}
	for i := range 50 {
		got := p.Pick(req(i, 0, 0, 10), fl)
		if got != 1 && got != 3 {
			t.Fatalf("picked %d (in flight %d), want one of the least loaded 1 or 3", got, fl[got].InFlight)
		}
		seen[got] = true
	}
	if !seen[1] || !seen[3] {
		t.Fatalf("ties not broken at random: saw %v", seen)
	}
}

func TestPowerOfTwo(t *testing.T) {
	// With two replicas both are always sampled: the less loaded wins.
	fl, _ := fleetOf(2)
	fl[0].InFlight, fl[1].InFlight = 5, 2
	p := &PowerOfTwo{rng: rand.New(rand.NewPCG(1, 2))}
	for i := range 20 {
		if got := p.Pick(req(i, 0, 0, 10), fl); got != 1 {
			t.Fatalf("picked %d, want the less loaded 1", got)
		}
	}
	// With many, the most loaded is never picked (it loses every pair).
	fl, _ = fleetOf(6)
	for i := range fl {
		fl[i].InFlight = i
	}
	for i := range 200 {
		if got := p.Pick(req(i, 0, 0, 10), fl); got == 5 {
			t.Fatal("picked the most loaded replica")
		}
	}
}

func newBoundedHash() *BoundedHash {
	return &BoundedHash{PrefixTokens: BoundedHashPrefixTokens, LoadFactor: BoundedHashLoadFactor, VirtualNodes: BoundedHashVirtualNodes}
}

func TestBoundedHash(t *testing.T) {
	fl, _ := fleetOf(8)
	p := newBoundedHash()
	// Same 256-token prefix, same replica, whatever follows.
	a := p.Pick(req(1, 7, 300, 400), fl)
	b := p.Pick(req(2, 7, 300, 900), fl)
	if a != b {
		t.Fatalf("same prefix on %d and %d", a, b)
	}
	// Different prefixes spread.
	seen := map[int]bool{}
	for g := range 64 {
		seen[p.Pick(req(g, 100+g, 300, 400), fl)] = true
	}
	if len(seen) < 6 {
		t.Fatalf("64 prefixes landed on %d replicas", len(seen))
	}
	// Bounded load: total in flight 16 over 8 replicas, bound
	// ceil(1.25 x 17 / 8) = 3. The home replica at 3 is full: walk on.
	for i := range fl {
		fl[i].InFlight = 2
	}
	fl[a].InFlight = 3
	fl[(a+1)%8].InFlight = 1 // keep the total at 16
	got := p.Pick(req(3, 7, 300, 400), fl)
	if got == a {
		t.Fatalf("picked the home replica %d above its bound", a)
	}
	if fl[got].InFlight >= 3 {
		t.Fatalf("picked replica %d with %d in flight, at the bound", got, fl[got].InFlight)
	}
}

func newSGLang() *SGLang {
	return &SGLang{CacheThreshold: SGLangCacheThreshold, BalanceAbs: SGLangBalanceAbs, BalanceRel: SGLangBalanceRel,
		BlockTokens: SGLangBlockTokens, MaxTreeSize: SGLangMaxTreeSize}
}

func TestSGLangCacheAware(t *testing.T) {
	fl, _ := fleetOf(4)
	p := newSGLang()
	// Cold: the least loaded worker (all idle: the first).
	r1 := req(1, 5, 1000, 1200)
	w := p.Pick(r1, fl)
	p.Routed(r1, w)
	if w != 0 {
		t.Fatalf("cold pick %d, want 0 (least loaded, first)", w)
	}
	// A request sharing 1000 of 1100 tokens (match rate 0.9 > 0.3)
	// follows it, even when that worker is busier (balanced: 10 vs 0 is
	// within the absolute threshold 64).
	fl[0].InFlight = 10
	r2 := req(2, 5, 1000, 1100)
	if got := p.Pick(r2, fl); got != 0 {
		t.Fatalf("warm pick %d, want 0", got)
	}
	// A request matching less than 30% goes to the least loaded worker
	// (today's gateway), not to the smallest tree (the original router):
	// worker 1 has the larger tree but the fewest requests in flight.
	p.Routed(req(9, 9, 0, 8000), 1)
	fl[1].InFlight, fl[2].InFlight, fl[3].InFlight = 0, 2, 3
	r3 := req(3, 5, 1000, 4000) // 1000/4000 = 0.25
	if got := p.Pick(r3, fl); got != 1 {
		t.Fatalf("low match rate picked %d, want 1 (least loaded)", got)
	}
}

func TestSGLangTunedThresholds(t *testing.T) {
	pol, err := NewPolicy("sglang-tuned", 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p := pol.(*SGLang)
	if p.Name() != "sglang-tuned" || p.BalanceAbs != 1 || p.CacheThreshold != 0.2 {
		t.Fatalf("sglang-tuned = %+v", p)
	}
	fl, _ := fleetOf(3)
	p.Routed(req(1, 5, 1000, 1200), 0)
	// 3 vs 1 in flight: imbalanced for the tuned variant (3-1 > 1 and
	// 3 > 1.5), balanced for the default (3-1 <= 64).
	fl[0].InFlight, fl[1].InFlight, fl[2].InFlight = 3, 1, 2
	if got := p.Pick(req(2, 5, 1000, 1100), fl); got != 1 {
		t.Fatalf("tuned picked %d, want the least loaded 1", got)
	}
	d := newSGLang()
	d.Routed(req(1, 5, 1000, 1200), 0)
	if got := d.Pick(req(2, 5, 1000, 1100), fl); got != 0 {
		t.Fatalf("default picked %d, want the cache's 0", got)
	}
	// A 25% match follows the cache with threshold 0.2, not with 0.3.
	fl[0].InFlight, fl[1].InFlight, fl[2].InFlight = 1, 1, 1
	if got := p.Pick(req(3, 5, 1000, 4000), fl); got != 0 {
		t.Fatalf("tuned 25%% match picked %d, want 0", got)
	}
}

func TestSoftmaxPick(t *testing.T) {
	logits := []float64{10, 0, 5}
	counts := make([]int, 3)
	const n = 10000
	for i := range n {
		counts[softmaxPick(logits, 0.5, (float64(i)+0.5)/n)]++
	}
	// Weights exp(-(l-min)/(max-min)/T): 1 for 0, e^-1 for 5, e^-2 for 10.
	total := 1 + math.Exp(-1) + math.Exp(-2)
	want := []float64{math.Exp(-2) / total, 1 / total, math.Exp(-1) / total}
	for i := range counts {
		if got := float64(counts[i]) / n; math.Abs(got-want[i]) > 0.01 {
			t.Errorf("worker %d drawn %.3f, want %.3f", i, got, want[i])
		}
	}
	if got := softmaxPick([]float64{2, 2}, 1, 0.75); got != 1 {
		t.Errorf("equal logits, u 0.75: %d, want 1 (uniform)", got)
	}
}

func TestLLMDPreciseScores(t *testing.T) {
	fl, fe := fleetOf(3)
	pol, err := NewPolicy("llm-d-precise", 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pol.(interface{ wantsEngineHashes() }); !ok || pol.Name() != "llm-d-precise" {
		t.Fatalf("%s does not ask for the engines' KV events", pol.Name())
	}
	r := req(1, 5, 1600, 3200)
	r.engHashes = engineHashes(0, 16, r.Prompt)
	for _, h := range r.engHashes[:100] {
		fl[1].cached[h] = struct{}{}
	}
	for _, h := range r.engHashes[:50] {
		fl[2].cached[h] = struct{}{}
	}
	p := pol.(llmdPrecise).LLMD
	p.preciseScores(r, fl)
	if want := []float64{0, 1, 0}; !slices.Equal(p.prefix, want) {
		t.Fatalf("scores %v, want %v (min-max over the pods holding blocks)", p.prefix, want)
	}
	// Prefix x 2 on 1 outweighs queue x 1 and KV x 1 elsewhere unless 1
	// is loaded: queue 0 and KV 0.9 there give 2 + 0.1 = 2.1 against
	// 1 + 1 = 2 on 0.
	fe[1].set(4, 0.9)
	if got := pol.Pick(r, fl); got != 1 {
		t.Fatalf("picked %d, want 1", got)
	}
	// When 2 holds the same prefix, both score 1 and load decides.
	for _, h := range r.engHashes[:100] {
		fl[2].cached[h] = struct{}{}
	}
	fe[2].set(0, 0.1)
	if got := pol.Pick(r, fl); got != 2 {
		t.Fatalf("picked %d, want 2 (same prefix, less loaded)", got)
	}
}

func TestSGLangFallsBackToLeastLoadWhenImbalanced(t *testing.T) {
	fl, _ := fleetOf(3)
	p := newSGLang()
	r1 := req(1, 5, 1000, 1200)
	p.Routed(r1, 0)
	tests := []struct {
		name  string
		loads [3]int
		want  int
	}{
		// max-min = 70 > 64 and 80 > 1.5 x 10: imbalanced, least load.
		{"imbalanced", [3]int{80, 10, 20}, 1},
		// max-min = 60 <= 64: balanced, the cache wins.
		{"abs within", [3]int{70, 10, 20}, 0},
		// max-min = 70 > 64 but 220 <= 1.5 x 150: balanced.
		{"rel within", [3]int{220, 150, 160}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, l := range tt.loads {
				fl[i].InFlight = l
			}
			if got := p.Pick(req(2, 5, 1000, 1100), fl); got != tt.want {
				t.Fatalf("picked %d, want %d", got, tt.want)
			}
		})
	}
}

func TestSGLangTreeBounded(t *testing.T) {
	p := newSGLang()
	p.MaxTreeSize = 100 * SGLangBlockTokens * 4 // 100 blocks
	p.ensure(1)
	for i := range 20 {
		p.clock++
		p.Routed(req(i, 100+i, 0, 160), 0) // 10 blocks each
	}
	if n := len(p.trees[0].last); n > 100 {
		t.Fatalf("tree holds %d blocks, bound 100", n)
	}
	// The most recent request is still there.
	if !p.trees[0].has(req(19, 119, 0, 160).Blocks(SGLangBlockTokens)[0]) {
		t.Fatal("evicted the most recent entry")
	}
}

func TestDynamoCost(t *testing.T) {
	fl, _ := fleetOf(3)
	p := &Dynamo{OverlapWeight: 1, rng: rand.New(rand.NewPCG(1, 1))}
	r := req(1, 5, 1600, 3200)
	r.engHashes = engineHashes(0, 16, r.Prompt)
	// Worker 1 holds the first 1600 tokens (100 blocks).
	for _, h := range r.engHashes[:100] {
		fl[1].cached[h] = struct{}{}
	}
	if got := p.Pick(r, fl); got != 1 {
		t.Fatalf("picked %d, want the worker holding the prefix", got)
	}
	p.Routed(r, 1)
	// The next request of the same group (a different session) shares
	// the first 100 blocks. On 1: (1600 queued + 1600 new)/16 prefill
	// blocks + (199 active + 99 new) blocks = 498; on 0 and 2: 3200/16 +
	// 199 = 399, a tie broken at random.
	r2 := req(2, 5, 1600, 3200)
	r2.engHashes = engineHashes(0, 16, r2.Prompt)
	seen := map[int]bool{}
	for range 40 {
		seen[p.Pick(r2, fl)] = true
	}
	if seen[1] || !seen[0] || !seen[2] {
		t.Fatalf("picked %v, want 0 and 2 at random, never the loaded 1", seen)
	}
	// Once the first request's prefill is done its queued tokens no
	// longer count: 1600/16 + 298 = 398 < 399.
	p.FirstToken(r, 1)
	if got := p.Pick(r2, fl); got != 1 {
		t.Fatalf("picked %d after the prefill finished, want 1", got)
	}
	p.Done(r, 1)
	if len(p.workers[1].active) != 0 || p.workers[1].prefill != 0 {
		t.Fatalf("worker state not released: %d active, %d prefill", len(p.workers[1].active), p.workers[1].prefill)
	}
}

func TestLLMDScorers(t *testing.T) {
	fl, fe := fleetOf(3)
	p := &LLMD{PrefixWeight: 3, QueueWeight: 2, KVWeight: 2, BlockTokens: 16, MaxBlocks: 256, LRUCapacity: 1000,
		rng: rand.New(rand.NewPCG(1, 1))}
	p.ensure(3)
	r := req(1, 5, 1600, 1600)
	p.Routed(r, 2)
	// Full prefix match on 2 (3 points) beats an empty queue and cache
	// elsewhere when 2's queue is the longest (0 points) and its KV is at
	// 40% (1.2 points): 4.2 vs 4.
	fe[0].set(0, 0)
	fe[1].set(0, 0)
	fe[2].set(4, 0.4)
	if got := p.Pick(req(2, 5, 1600, 1600), fl); got != 2 {
		t.Fatalf("picked %d, want 2 (prefix 3 + kv 1.2 > queue 2 + kv 2)", got)
	}
	// At 60% KV usage: 3 + 0.8 = 3.8 < 4: load wins.
	fe[2].set(4, 0.6)
	if got := p.Pick(req(2, 5, 1600, 1600), fl); got == 2 {
		t.Fatal("picked 2; queue and KV scores should outweigh the prefix")
	}
}

func TestLRUSet(t *testing.T) {
	s := newLRUSet(3)
	s.add(1)
	s.add(2)
	s.add(3)
	s.add(1) // refresh 1: 2 is now the oldest
	s.add(4) // evicts 2
	for h, want := range map[uint64]bool{1: true, 2: false, 3: true, 4: true} {
		if s.has(h) != want {
			t.Errorf("has(%d) = %v, want %v", h, !want, want)
		}
	}
	if len(s.idx) != 3 {
		t.Fatalf("%d entries, capacity 3", len(s.idx))
	}
}

func TestEngineHashesMatchEngine(t *testing.T) {
	// The hashes Dynamo looks up are the engine's own: after a request
	// ran, the engine's KV events mirror holds them.
	fl, _ := fleetOf(1)
	e := engine.New(engine.Config{})
	e.SetKVEventHandler(fl[0].mirror)
	r := req(1, 5, 800, 1000)
	if err := e.Submit(engine.Request{ID: 1, Prompt: r.Prompt, MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, ok := e.Step(nil); !ok {
			break
		}
	}
	hs := engineHashes(e.Config().HashSeed, e.Config().BlockSize, r.Prompt)
	if got := fl[0].CachedBlocks(hs); got != len(hs) {
		t.Fatalf("mirror holds %d of %d blocks", got, len(hs))
	}
	if got, want := len(hs)*16, e.CachedPrefix(r.Prompt); got != want {
		t.Fatalf("hashes cover %d tokens, engine CachedPrefix %d", got, want)
	}
}

func TestRamjetMarginalIgnoresFleetWidePrefix(t *testing.T) {
	synth := workload.Synth{Salt: 1}
	mk := func(session, turn, input int) *Request {
		row := workload.Request{ID: turn, After: -1, Session: session, Turn: turn, Group: 9, Prefix: 2048, Input: input, Output: 16}
		return &Request{Row: row, Prompt: synth.Prompt(nil, row), Output: synth.Completion(nil, row)}
	}
	shared := mk(99, 0, 2048) // the system prompt alone
	turn0 := mk(7, 0, 4096)
	turn1 := mk(7, 1, 5000)
	cfg := selection.Config{AffinityCap: 1024, RequestCost: 256}
	for _, tt := range []struct {
		marginal bool
		want     int
	}{{false, 0}, {true, 1}} {
		fl, _ := fleetOf(2)
		p, err := NewRamjet(cfg)
		if tt.marginal {
			p, err = NewRamjetMarginal(cfg)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := p.ensure(fl); err != nil {
			t.Fatal(err)
		}
		rt := p.Router()
		// Both replicas hold the system prompt; replica 1 also holds the
		// conversation and serves one request.
		for s, r := range map[selection.Slot]*Request{0: shared, 1: turn0} {
			p.features(r)
			rt.Learn(p.f, s)
		}
		p.features(shared)
		rt.Learn(p.f, 1)
		rt.Reserve(1, 0)
		// Plain: both overlaps (2048 and 4096) are capped at 1024, so the
		// idle replica 0 wins. Marginal: replica 1 is 2048 tokens warmer
		// than the least warm (capped at 1024) against 256 of load.
		if got := p.Pick(turn1, fl); got != tt.want {
			t.Errorf("marginal=%v picked %d, want %d", tt.marginal, got, tt.want)
		}
		p.Done(turn1, tt.want)
		if inflight, pending := rt.Load(selection.Slot(tt.want)); inflight != int64(tt.want) || pending != 0 {
			t.Errorf("marginal=%v: slot %d left with %d in flight, %d pending", tt.marginal, tt.want, inflight, pending)
		}
	}
}

func TestRamjetContextWeighsInFlightContext(t *testing.T) {
	fl, _ := fleetOf(2)
	p, err := NewRamjetContext(selection.Config{RequestCost: 1000}, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Router().Config().RequestCost; got != 1000 {
		t.Fatalf("request cost %d, want 1000 unchanged", got)
	}
	long := req(1, 5, 0, 8000)
	rep := p.Pick(long, fl)
	p.FirstToken(long, rep)
	// After the prefill: one in-flight reservation (1000) and its 8000
	// resident context tokens stay until completion.
	inflight, pending := p.Router().Load(selection.Slot(rep))
	resident := p.Router().Resident(selection.Slot(rep))
	if inflight != 1 || pending != 0 || resident != 8000 {
		t.Fatalf("load after prefill: %d in flight, %d pending, %d resident; want 1, 0 and 8000", inflight, pending, resident)
	}
	// A short cold request avoids the replica holding the long context.
	if got := p.Pick(req(2, 6, 0, 100), fl); got == rep {
		t.Fatal("picked the replica decoding the long context")
	}
	p.Done(long, rep)
	if inflight, pending := p.Router().Load(selection.Slot(rep)); inflight != 0 || pending != 0 || p.Router().Resident(selection.Slot(rep)) != 0 {
		t.Fatalf("left %d in flight, %d pending, %d resident", inflight, pending, p.Router().Resident(selection.Slot(rep)))
	}
}

// The yardstick's experiment variants of Dynamo: SumActive counts a block
// shared by two in-flight sequences twice (as ramjet's resident context
// did), NoDecode leaves the active-block term out.
func TestDynamoVariants(t *testing.T) {
	fl, _ := fleetOf(2)
	r := req(1, 5, 1600, 3200)
	r.engHashes = engineHashes(0, 16, r.Prompt)
	r2 := req(2, 5, 1600, 3200) // shares r's first 100 blocks
	r2.engHashes = engineHashes(0, 16, r2.Prompt)
	for _, tt := range []struct {
		name string
		p    *Dynamo
		want int // worker 0's logit for r2, less worker 1's
	}{
		// Worker 0 runs r (prefill done, 199 active blocks); worker 1
		// is idle. Prefill terms are equal (nothing cached); decode:
		// distinct 199 + 99 new against 199.
		{"distinct", &Dynamo{OverlapWeight: 1}, 99},
		{"sum", &Dynamo{OverlapWeight: 1, SumActive: true}, 199},
		{"no decode", &Dynamo{OverlapWeight: 1, NoDecode: true}, 0},
	} {
		tt.p.rng = rand.New(rand.NewPCG(1, 1))
		tt.p.Pick(r, fl)
		tt.p.Routed(r, 0)
		tt.p.FirstToken(r, 0)
		tt.p.Pick(r2, fl)
		if got := tt.p.logits[0] - tt.p.logits[1]; got != float64(tt.want) {
			t.Errorf("%s: worker 0's logit exceeds worker 1's by %v, want %d", tt.name, got, tt.want)
		}
		tt.p.Done(r, 0)
		if w := tt.p.workers[0]; len(w.active) != 0 || w.sum != 0 || w.prefill != 0 {
			t.Errorf("%s: worker state not released: %+v", tt.name, w)
		}
	}
}
