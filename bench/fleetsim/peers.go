package fleetsim

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/cespare/xxhash/v2"
)

// ---------------------------------------------------------------------------
// Round robin, least in-flight, power of two choices.

// RoundRobin cycles through the replicas in order.
type RoundRobin struct {
	hooks
	next int
}

func (*RoundRobin) Name() string { return "round-robin" }

func (p *RoundRobin) Pick(_ *Request, fleet []*Replica) int {
	i := p.next % len(fleet)
	p.next++
	return i
}

// LeastInFlight picks the replica with the fewest in-flight requests
// (Caddy's least_conn, Envoy's LEAST_REQUEST with all candidates); ties
// are broken at random.
type LeastInFlight struct {
	hooks
	rng *rand.Rand
}

func (*LeastInFlight) Name() string { return "least-inflight" }

func (p *LeastInFlight) Pick(_ *Request, fleet []*Replica) int {
	best, n := -1, 0
	for i, r := range fleet {
		switch {
		case best < 0 || r.InFlight < fleet[best].InFlight:
			best, n = i, 1
		case r.InFlight == fleet[best].InFlight:
			// Reservoir sampling among the tied.
			n++
			if p.rng.IntN(n) == 0 {
				best = i
			}
		}
	}
	return best
}

// PowerOfTwo samples two distinct replicas at random and picks the one with
// fewer in-flight requests (Mitzenmacher, "The Power of Two Choices in
// Randomized Load Balancing", 2001; sgl-model-gateway power_of_two).
type PowerOfTwo struct {
	hooks
	rng *rand.Rand
}

func (*PowerOfTwo) Name() string { return "power-of-two" }

func (p *PowerOfTwo) Pick(_ *Request, fleet []*Replica) int {
	if len(fleet) == 1 {
		return 0
	}
	a := p.rng.IntN(len(fleet))
	b := p.rng.IntN(len(fleet) - 1)
	if b >= a {
		b++
	}
	if fleet[b].InFlight < fleet[a].InFlight {
		return b
	}
	return a
}

// ---------------------------------------------------------------------------
// Consistent hashing with bounded loads.

// BoundedHash is consistent hashing with bounded loads (Mirrokni, Thorup,
// Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018) keyed
// on the prompt prefix: the first PrefixTokens tokens are hashed onto a
// ring of VirtualNodes points per replica; the request goes to the first
// replica clockwise whose in-flight count is at most
// ceil(LoadFactor x (total in-flight + 1) / replicas). Defaults follow
// sgl-model-gateway's prefix_hash policy (src/policies/prefix_hash.rs:
// prefix_token_count 256, load_factor 1.25), with the ring walk of the
// paper rather than prefix_hash's jump to the least loaded replica.
type BoundedHash struct {
	hooks
	PrefixTokens int
	LoadFactor   float64
	VirtualNodes int

	ring   []ringPoint
	forLen int
}

type ringPoint struct {
	hash uint64
	rep  int
}

func (*BoundedHash) Name() string { return "bounded-hash" }

func (p *BoundedHash) build(n int) {
	p.ring = p.ring[:0]
	var buf [16]byte
	for r := range n {
		for v := range p.VirtualNodes {
			for i := range 8 {
				buf[i] = byte(r >> (8 * i))
				buf[8+i] = byte(v >> (8 * i))
			}
			p.ring = append(p.ring, ringPoint{xxhash.Sum64(buf[:]), r})
		}
	}
	sort.Slice(p.ring, func(i, j int) bool { return p.ring[i].hash < p.ring[j].hash })
	p.forLen = n
}

func (p *BoundedHash) Pick(r *Request, fleet []*Replica) int {
	if p.forLen != len(fleet) {
		p.build(len(fleet))
	}
	n := min(len(r.Prompt), p.PrefixTokens)
	var d xxhash.Digest
	d.Reset()
	var b [4]byte
	for _, t := range r.Prompt[:n] {
		b[0], b[1], b[2], b[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		d.Write(b[:])
	}
	key := d.Sum64()
	total := 0
	for _, rep := range fleet {
		total += rep.InFlight
	}
	limit := int(math.Ceil(p.LoadFactor * float64(total+1) / float64(len(fleet))))
	start := sort.Search(len(p.ring), func(i int) bool { return p.ring[i].hash >= key })
	for k := range p.ring {
		pt := p.ring[(start+k)%len(p.ring)]
		if fleet[pt.rep].InFlight < limit {
			return pt.rep
		}
	}
	return p.ring[start%len(p.ring)].rep
}

// ---------------------------------------------------------------------------
// SGLang cache_aware.

// SGLang reimplements today's sgl-model-gateway cache_aware policy
// (sgl-project/sglang, sgl-model-gateway/src/policies/cache_aware.rs,
// select_worker, with the command-line defaults of the gateway's CLI:
// --cache-threshold 0.3, --balance-abs-threshold 64,
// --balance-rel-threshold 1.5, --max-tree-size 67108864):
//
//   - load is the router's count of in-flight requests per worker;
//   - when max-min > BalanceAbs and max > BalanceRel x min, the system is
//     imbalanced: route to the least loaded worker (and still insert the
//     prompt into that worker's tree);
//   - otherwise find the worker whose approximate tree matches the longest
//     prefix of the prompt; if the match rate (matched / prompt length)
//     exceeds CacheThreshold route there, else to the least loaded worker
//     (the current gateway; the original sgl-router sent misses to the
//     worker with the smallest tree); insert the prompt into the chosen
//     worker's tree.
//
// The trees store raw text in SGLang; here they store the prompt's chained
// blocks of BlockTokens tokens (16: one vLLM block, 64 characters), so a
// match is exact to one block. Each worker's tree is bounded by MaxTreeSize
// characters (tokens x 4) and evicts least recently used entries past it.
type SGLang struct {
	hooks
	CacheThreshold float64
	BalanceAbs     int
	BalanceRel     float64
	BlockTokens    int
	MaxTreeSize    int

	// Label is the row name; "" means "sglang".
	Label string

	trees []sglTree
	clock uint64
	cands []int
}

type sglTree struct {
	last map[uint64]uint64 // block -> last access (router clock)
}

func (p *SGLang) Name() string {
	if p.Label != "" {
		return p.Label
	}
	return "sglang"
}

func (p *SGLang) ensure(n int) {
	for len(p.trees) < n {
		p.trees = append(p.trees, sglTree{last: make(map[uint64]uint64)})
	}
}

func (t *sglTree) has(h uint64) bool { _, ok := t.last[h]; return ok }

// size is the tree's size in characters, as SGLang counts it.
func (t *sglTree) size(blockTokens int) int { return len(t.last) * blockTokens * 4 }

func (p *SGLang) Pick(r *Request, fleet []*Replica) int {
	p.ensure(len(fleet))
	p.clock++
	maxL, minL := math.MinInt, math.MaxInt
	for _, rep := range fleet {
		maxL, minL = max(maxL, rep.InFlight), min(minL, rep.InFlight)
	}
	leastLoaded := func() int {
		best := 0
		for i, rep := range fleet {
			if rep.InFlight < fleet[best].InFlight {
				best = i
			}
		}
		return best
	}
	if maxL-minL > p.BalanceAbs && float64(maxL) > float64(minL)*p.BalanceRel {
		return leastLoaded()
	}
	blocks := r.Blocks(p.BlockTokens)
	// Longest match: narrow the workers holding every block so far; the
	// matched worker is the most recently used of those left at the
	// deepest matched block.
	p.cands = p.cands[:0]
	for i := range fleet {
		p.cands = append(p.cands, i)
	}
	depth, worker := 0, -1
	for d, h := range blocks {
		next := p.cands[:0]
		w, lastSeen := -1, uint64(0)
		for _, i := range p.cands {
			if at, ok := p.trees[i].last[h]; ok {
				next = append(next, i)
				if w < 0 || at > lastSeen {
					w, lastSeen = i, at
				}
			}
		}
		p.cands = next
		if w < 0 {
			break
		}
		depth, worker = d+1, w
	}
	rate := 0.0
	if len(r.Prompt) > 0 {
		rate = float64(depth*p.BlockTokens) / float64(len(r.Prompt))
	}
	if worker >= 0 && rate > p.CacheThreshold {
		return worker
	}
	return leastLoaded()
}

func (p *SGLang) Routed(r *Request, rep int) {
	p.ensure(rep + 1)
	t := &p.trees[rep]
	for _, h := range r.Blocks(p.BlockTokens) {
		t.last[h] = p.clock
	}
	if t.size(p.BlockTokens) > p.MaxTreeSize {
		// Evict the least recently used entries down to 90%.
		type kv struct{ h, at uint64 }
		all := make([]kv, 0, len(t.last))
		for h, at := range t.last {
			all = append(all, kv{h, at})
		}
		slices.SortFunc(all, func(a, b kv) int {
			if c := cmp.Compare(a.at, b.at); c != 0 {
				return c
			}
			return cmp.Compare(a.h, b.h)
		})
		keep := p.MaxTreeSize * 9 / 10 / (p.BlockTokens * 4)
		for _, e := range all[:len(all)-keep] {
			delete(t.last, e.h)
		}
	}
}

// ---------------------------------------------------------------------------
// Dynamo KV router.

// Dynamo reimplements NVIDIA Dynamo's KV router cost (ai-dynamo/dynamo,
// lib/kv-router/src/scheduling/selector.rs, DefaultWorkerSelector; docs
// "KV Router", cost function):
//
//	logit = overlap_score_weight x potential_prefill_blocks + potential_active_blocks
//
// potential_prefill_blocks is the worker's queued prefill tokens (requests
// routed there whose prefill has not finished) plus this request's tokens
// not cached there, over the block size; potential_active_blocks is the
// worker's active blocks (distinct blocks of its in-flight sequences) plus
// this request's blocks not among them. Cached blocks come from the
// engines' KV events (Dynamo's default, --kv-events). Defaults:
// overlap_score_weight 1.0, router temperature 0 (lowest logit wins),
// ties broken at random (lib/kv-router/src/scheduling/config.rs,
// SchedulerConfig::default). With Temperature > 0 the worker is drawn
// from softmax(-logit / (max-min) / Temperature), as selector.rs's
// softmax_sample does.
type Dynamo struct {
	OverlapWeight float64
	Temperature   float64
	// Label is the row name; "" means "dynamo".
	Label string
	// SumActive counts a worker's active blocks per in-flight sequence
	// (a block shared by two sequences twice), not distinct (experiment).
	SumActive bool
	// NoDecode leaves the decode term out (experiment).
	NoDecode bool

	rng     *rand.Rand
	workers []dynWorker
	reqs    map[int]dynReq // by trace ID
	scratch []int
	newTok  []int // per worker, this request's uncached tokens there
	logits  []float64
}

type dynWorker struct {
	prefill int            // queued prefill tokens
	sum     int            // blocks of its in-flight sequences, shared ones counted per sequence
	active  map[uint64]int // block -> refs of in-flight sequences
}

type dynReq struct {
	prefill int
	blocks  []uint64
}

func (p *Dynamo) Name() string {
	if p.Label != "" {
		return p.Label
	}
	return "dynamo"
}

func (*Dynamo) wantsEngineHashes() {}

func (p *Dynamo) ensure(n int) {
	if p.reqs == nil {
		p.reqs = make(map[int]dynReq)
	}
	for len(p.workers) < n {
		p.workers = append(p.workers, dynWorker{active: make(map[uint64]int)})
	}
}

func (p *Dynamo) Pick(r *Request, fleet []*Replica) int {
	p.ensure(len(fleet))
	bs := float64(len(r.Prompt)) / math.Max(1, float64(len(r.engHashes)))
	if len(r.engHashes) == 0 {
		bs = 16
	}
	bs = math.Round(bs)
	if bs < 1 {
		bs = 1
	}
	best := math.Inf(1)
	p.scratch = p.scratch[:0]
	p.newTok = p.newTok[:0]
	p.logits = p.logits[:0]
	for i, rep := range fleet {
		w := &p.workers[i]
		overlap := rep.CachedBlocks(r.engHashes)
		newTokens := max(0, len(r.Prompt)-int(float64(overlap)*bs))
		p.newTok = append(p.newTok, newTokens)
		prefillBlocks := float64(w.prefill+newTokens) / bs
		// The active set is prefix-closed (every active sequence holds its
		// whole chain), so the request's blocks already active are a
		// leading run: find its end by binary search.
		shared := sort.Search(len(r.engHashes), func(k int) bool {
			_, ok := w.active[r.engHashes[k]]
			return !ok
		})
		decode := len(w.active) + len(r.engHashes) - shared
		if p.SumActive {
			decode = w.sum + len(r.engHashes)
		}
		if p.NoDecode {
			decode = 0
		}
		logit := p.OverlapWeight*prefillBlocks + float64(decode)
		p.logits = append(p.logits, logit)
		switch {
		case logit < best:
			best = logit
			p.scratch = append(p.scratch[:0], i)
		case logit == best:
			p.scratch = append(p.scratch, i)
		}
	}
	if p.Temperature > 0 {
		return softmaxPick(p.logits, p.Temperature, p.rng.Float64())
	}
	return p.scratch[p.rng.IntN(len(p.scratch))]
}

// softmaxPick draws an index with probability proportional to
// exp(-(logit/(max-min))/temperature), lowest logit likeliest (Dynamo's
// softmax_sample); uniform when all logits are equal. u is in [0,1).
func softmaxPick(logits []float64, temperature, u float64) int {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, l := range logits {
		lo, hi = math.Min(lo, l), math.Max(hi, l)
	}
	if lo == hi {
		return min(int(u*float64(len(logits))), len(logits)-1)
	}
	r := hi - lo
	total := 0.0
	w := make([]float64, len(logits))
	for i, l := range logits {
		// Shift by the best (lowest) logit so the largest weight is 1.
		w[i] = math.Exp(-(l - lo) / r / temperature)
		total += w[i]
	}
	x := u * total
	for i, v := range w {
		if x < v {
			return i
		}
		x -= v
	}
	return len(w) - 1
}

func (p *Dynamo) Routed(r *Request, rep int) {
	p.ensure(rep + 1)
	w := &p.workers[rep]
	// The prefill the worker must do: its tokens not cached there at
	// decision time (the router's own estimate, as Dynamo's
	// ActiveSequences keeps it).
	d := dynReq{blocks: r.engHashes, prefill: p.newTok[rep]}
	w.prefill += d.prefill
	for _, h := range d.blocks {
		w.active[h]++
	}
	w.sum += len(d.blocks)
	p.reqs[r.Row.ID] = d
}

func (p *Dynamo) FirstToken(r *Request, rep int) {
	d, ok := p.reqs[r.Row.ID]
	if !ok || d.prefill < 0 {
		return
	}
	p.workers[rep].prefill -= d.prefill
	d.prefill = -1
	p.reqs[r.Row.ID] = d
}

func (p *Dynamo) Done(r *Request, rep int) {
	d, ok := p.reqs[r.Row.ID]
	if !ok {
		return
	}
	w := &p.workers[rep]
	if d.prefill >= 0 {
		w.prefill -= d.prefill
	}
	for _, h := range d.blocks {
		if w.active[h]--; w.active[h] <= 0 {
			delete(w.active, h)
		}
	}
	w.sum -= len(d.blocks)
	delete(p.reqs, r.Row.ID)
}

// ---------------------------------------------------------------------------
// llm-d weighted scorers.

// LLMD reimplements llm-d's inference scheduler default profile (the
// Gateway API Inference Extension's EPP scorers with llm-d's weights):
// prefix-cache-scorer x 3, queue-scorer x 2, kv-cache-utilization-scorer
// x 2, max-score picker with random ties.
//
//   - prefix (gateway-api-inference-extension, pkg/epp/scheduling/
//     framework/plugins/multi/prefix/plugin.go): the prompt is cut into
//     blocks of 64 characters (16 tokens here), at most 256 blocks;
//     score = longest matched prefix blocks / prompt blocks, from an
//     approximate per-server LRU index (31250 entries per server) filled
//     with the blocks of every routed request;
//   - queue (plugins/scorer/queue.go): (max waiting - waiting) /
//     (max waiting - min waiting), 1 when all equal;
//   - kv-cache utilization (plugins/scorer/kvcache_utilization.go):
//     1 - KV cache usage.
//
// The engines' metrics are read live; the real EPP scrapes them every
// 50 ms, so this is slightly kinder to llm-d than reality.
type LLMD struct {
	PrefixWeight, QueueWeight, KVWeight float64
	BlockTokens                         int
	MaxBlocks                           int
	LRUCapacity                         int
	// Precise replaces the approximate prefix scorer by llm-d's
	// precise-prefix-cache-scorer (llm-d-inference-scheduler,
	// pkg/plugins/scorer/precise_prefix_cache.go, with the llm-d guide
	// guides/precise-prefix-cache-aware: weights precise prefix 2,
	// kv-cache-utilization 1, queue 1): the index is the engines' own KV
	// events; each pod's score is its longest run of leading blocks
	// present, min-max normalised over the pods that hold any
	// (indexedScoresToNormalizedScoredPods: 1 when all equal, 0 for pods
	// holding none).
	Precise bool
	// Label is the row name; "" means "llm-d".
	Label string

	rng     *rand.Rand
	servers []lruSet
	scratch []int
	prefix  []float64
}

func (p *LLMD) Name() string {
	if p.Label != "" {
		return p.Label
	}
	return "llm-d"
}

// llmdPrecise is LLMD in precise mode: it needs the engines' KV events.
type llmdPrecise struct{ *LLMD }

func (llmdPrecise) wantsEngineHashes() {}

// preciseScores fills p.prefix with each replica's normalised precise
// prefix score.
func (p *LLMD) preciseScores(r *Request, fleet []*Replica) {
	p.prefix = p.prefix[:0]
	lo, hi := math.MaxInt, -1
	for _, rep := range fleet {
		n := rep.CachedBlocks(r.engHashes)
		p.prefix = append(p.prefix, float64(n))
		if n > 0 {
			lo, hi = min(lo, n), max(hi, n)
		}
	}
	for i, v := range p.prefix {
		switch {
		case v == 0:
			p.prefix[i] = 0
		case lo == hi:
			p.prefix[i] = 1
		default:
			p.prefix[i] = (v - float64(lo)) / float64(hi-lo)
		}
	}
}

func (p *LLMD) ensure(n int) {
	for len(p.servers) < n {
		p.servers = append(p.servers, newLRUSet(p.LRUCapacity))
	}
}

func (p *LLMD) hashes(r *Request) []uint64 {
	b := r.Blocks(p.BlockTokens)
	if len(b) > p.MaxBlocks {
		b = b[:p.MaxBlocks]
	}
	return b
}

func (p *LLMD) Pick(r *Request, fleet []*Replica) int {
	p.ensure(len(fleet))
	var hs []uint64
	if !p.Precise {
		hs = p.hashes(r)
	}
	minQ, maxQ := math.MaxInt, math.MinInt
	for _, rep := range fleet {
		minQ, maxQ = min(minQ, rep.Waiting()), max(maxQ, rep.Waiting())
	}
	if p.Precise {
		p.preciseScores(r, fleet)
	}
	best := math.Inf(-1)
	p.scratch = p.scratch[:0]
	for i, rep := range fleet {
		prefix := 0.0
		switch {
		case p.Precise:
			prefix = p.prefix[i]
		case len(hs) > 0:
			m := 0
			for _, h := range hs {
				if !p.servers[i].has(h) {
					break
				}
				m++
			}
			prefix = float64(m) / float64(len(hs))
		}
		queue := 1.0
		if maxQ != minQ {
			queue = float64(maxQ-rep.Waiting()) / float64(maxQ-minQ)
		}
		kv := 1 - rep.KVUsage()
		s := p.PrefixWeight*prefix + p.QueueWeight*queue + p.KVWeight*kv
		switch {
		case s > best:
			best = s
			p.scratch = append(p.scratch[:0], i)
		case s == best:
			p.scratch = append(p.scratch, i)
		}
	}
	return p.scratch[p.rng.IntN(len(p.scratch))]
}

func (p *LLMD) Routed(r *Request, rep int) {
	if p.Precise {
		return
	}
	p.ensure(rep + 1)
	for _, h := range p.hashes(r) {
		p.servers[rep].add(h)
	}
}

func (*LLMD) FirstToken(*Request, int) {}
func (*LLMD) Done(*Request, int)       {}

// lruSet is a bounded set of block hashes with least-recently-used
// eviction (the prefix plugin's per-server LRU indexer).
type lruSet struct {
	cap   int
	idx   map[uint64]int32 // hash -> node
	nodes []lruNode
	head  int32 // most recent
	tail  int32 // least recent
}

type lruNode struct {
	h          uint64
	prev, next int32
}

func newLRUSet(capacity int) lruSet {
	return lruSet{cap: capacity, idx: make(map[uint64]int32), head: -1, tail: -1}
}

func (s *lruSet) has(h uint64) bool { _, ok := s.idx[h]; return ok }

func (s *lruSet) unlink(i int32) {
	n := &s.nodes[i]
	if n.prev >= 0 {
		s.nodes[n.prev].next = n.next
	} else {
		s.head = n.next
	}
	if n.next >= 0 {
		s.nodes[n.next].prev = n.prev
	} else {
		s.tail = n.prev
	}
}

func (s *lruSet) pushFront(i int32) {
	n := &s.nodes[i]
	n.prev, n.next = -1, s.head
	if s.head >= 0 {
		s.nodes[s.head].prev = i
	}
	s.head = i
	if s.tail < 0 {
		s.tail = i
	}
}

// add inserts or refreshes h, evicting the least recently used entry past
// capacity.
func (s *lruSet) add(h uint64) {
	if i, ok := s.idx[h]; ok {
		s.unlink(i)
		s.pushFront(i)
		return
	}
	var i int32
	if len(s.nodes) < s.cap {
		s.nodes = append(s.nodes, lruNode{h: h})
		i = int32(len(s.nodes) - 1)
	} else {
		i = s.tail
		s.unlink(i)
		delete(s.idx, s.nodes[i].h)
		s.nodes[i].h = h
	}
	s.idx[h] = i
	s.pushFront(i)
}

// Oracle marks the policy row of the infinite-cache bound.
const Oracle = "oracle"
