package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Errors returned by Submit.
var (
	ErrEmptyPrompt   = errors.New("prompt is empty")
	ErrBadMaxTokens  = errors.New("max tokens must be at least 1")
	ErrContextLength = errors.New("context length exceeded")
	ErrTooLarge      = errors.New("request needs more KV blocks than the engine has")
	ErrQueueFull     = errors.New("waiting queue is full")
	ErrDuplicateID   = errors.New("request id already active")
)

// Request is one generation request.
type Request struct {
	// ID identifies the request in events; unique among active requests.
	ID uint64
	// Prompt is the prompt's token ids. The engine keeps the slice: the
	// caller must not modify it until the request finished or was aborted.
	Prompt []uint32
	// MaxTokens is the number of tokens to generate (at least 1). The
	// engine always generates exactly this many (no early stop).
	MaxTokens int
	// Output optionally gives the ids of the generated tokens, so that the
	// cached blocks of a reply match the next turn's rendering (see
	// ReplyTokens). Tokens past len(Output) are synthetic.
	Output []uint32
}

// Usage is a finished request's accounting, as in OpenAI's usage object.
type Usage struct {
	PromptTokens     int
	CachedTokens     int // leading prompt tokens served from the prefix cache
	CompletionTokens int
}

// EventKind is the kind of a per-request Event.
type EventKind uint8

const (
	// EventFirstToken: prefill finished and the first token was sampled.
	EventFirstToken EventKind = iota + 1
	// EventTokens: more tokens were generated.
	EventTokens
	// EventFinished: the request generated MaxTokens tokens and left the
	// engine. It follows the FirstToken or Tokens event of the same step.
	EventFinished
)

func (k EventKind) String() string {
	switch k {
	case EventFirstToken:
		return "first_token"
	case EventTokens:
		return "tokens"
	case EventFinished:
		return "finished"
	}
	return "unknown"
}

// Event is what happened to one request at the end of a step.
type Event struct {
	Kind EventKind
	ID   uint64
	// At is the simulated time (the end of the step).
	At time.Duration
	// NewTokens is the number of tokens generated in this step
	// (FirstToken, Tokens); Generated is the total so far.
	NewTokens int
	Generated int
	// Usage is set on every event; CachedTokens is final from the first
	// token on.
	Usage Usage
	// Arrival and FirstTokenAt are the request's submit time and
	// first-token time (FirstTokenAt is 0 before the first token).
	Arrival      time.Duration
	FirstTokenAt time.Duration
}

// Stats is a snapshot of an engine's state and cumulative counters.
type Stats struct {
	Now              time.Duration
	Running, Waiting int
	// UsedBlocks are blocks referenced by sequences; CachedBlocks are
	// blocks in the prefix cache (referenced or not).
	UsedBlocks, CachedBlocks, TotalBlocks int
	// KVUsage is UsedBlocks/TotalBlocks, as vllm:kv_cache_usage_perc.
	KVUsage float64
	// PendingPrefillTokens is the prompt tokens still to compute over
	// waiting and running requests (cached prefixes of waiting requests
	// are not known before admission and count as pending).
	PendingPrefillTokens int
	// PrefixQueries and PrefixHits count tokens, as vLLM's prefix cache
	// counters: every admission queries all its tokens and hits its cached
	// ones.
	PrefixQueries, PrefixHits uint64
	// PromptTokens and GenerationTokens count tokens of finished requests.
	PromptTokens, GenerationTokens uint64
	Finished, Preemptions, Steps   uint64
	// Speculative decoding: drafts (one per sequence per step), draft
	// tokens proposed and accepted.
	SpecDrafts, SpecDraftTokens, SpecAcceptedTokens uint64
	// SpecAcceptedPerPos[p] counts the drafts whose token at position p
	// (0-based) was accepted, as vLLM's
	// spec_decode_num_accepted_tokens_per_pos; nil without speculative
	// decoding.
	SpecAcceptedPerPos []uint64
}

type seq struct {
	req          Request
	arrival      time.Duration
	firstAt      time.Duration
	numTokens    int // prompt + generated
	computed     int // tokens whose KV is computed
	generated    int
	blocks       []*block // held blocks; nil = private (uncached)
	nCached      int      // leading entries of blocks already hashed and decided
	hashes       []uint64 // chain hashes of the full blocks so far
	cachedTokens int
	cachedSet    bool
	inPlan       bool
	aborted      bool
}

type planItem struct {
	s    *seq
	n    int // tokens to compute
	spec int // draft tokens to verify
}

type plan struct {
	start, end time.Duration
	items      []planItem
}

// Engine is one simulated engine. See the package doc for the protocol.
type Engine struct {
	cfg     Config
	clock   time.Duration
	cache   *prefixCache
	seqs    map[uint64]*seq
	waiting []*seq
	running []*seq
	plan    *plan
	spare   plan
	rng     *rand.Rand
	stats   Stats
	sink    func(KVEvent)
	removed []uint64
	tokBuf  []uint32
}

// New returns an engine at time 0. It panics on an invalid config after
// defaults; use Config.Validate first to get an error.
func New(cfg Config) *Engine {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		panic(fmt.Sprintf("engine: %v", err))
	}
	return &Engine{
		cfg:   cfg,
		cache: newPrefixCache(cfg.TotalBlocks()),
		seqs:  make(map[uint64]*seq),
		rng:   rand.New(rand.NewPCG(cfg.Seed, 0x5eed)),
	}
}

// Config returns the engine's config with defaults filled.
func (e *Engine) Config() Config { return e.cfg }

// SetKVEventHandler sets fn to receive every KV cache event synchronously,
// in order (nil disables). The event's slices belong to fn.
func (e *Engine) SetKVEventHandler(fn func(KVEvent)) { e.sink = fn }

// SetSpecAcceptance changes the draft acceptance rate at run time (fault
// injection: a collapsed acceptance rate). Values are clamped to [0,1].
func (e *Engine) SetSpecAcceptance(a float64) {
	e.cfg.SpecAcceptance = min(max(a, 0), 1)
}

// Now is the engine's clock.
func (e *Engine) Now() time.Duration { return e.clock }

// Running is the number of admitted sequences.
func (e *Engine) Running() int { return len(e.running) }

// Waiting is the number of queued requests.
func (e *Engine) Waiting() int { return len(e.waiting) }

// KVUsage is the share of KV blocks referenced by sequences, in [0,1].
func (e *Engine) KVUsage() float64 {
	return float64(e.cache.used) / float64(e.cache.total)
}

// Stats returns a snapshot of state and counters.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.SpecAcceptedPerPos = slices.Clone(e.stats.SpecAcceptedPerPos)
	s.Now = e.clock
	s.Running, s.Waiting = len(e.running), len(e.waiting)
	s.UsedBlocks, s.CachedBlocks, s.TotalBlocks = e.cache.used, e.cache.cached.len(), e.cache.total
	s.KVUsage = e.KVUsage()
	for _, q := range [2][]*seq{e.waiting, e.running} {
		for _, x := range q {
			if n := x.numTokens - x.computed; n > 1 || x.generated == 0 {
				s.PendingPrefillTokens += n
			}
		}
	}
	return s
}

// Submit queues req, arriving at Now(). It joins the next step that starts
// after it (a step already planned at the same instant is not changed).
func (e *Engine) Submit(req Request) error {
	switch {
	case len(req.Prompt) == 0:
		return ErrEmptyPrompt
	case req.MaxTokens < 1:
		return ErrBadMaxTokens
	case len(req.Prompt)+req.MaxTokens > e.cfg.MaxModelLen:
		return fmt.Errorf("%w: %d prompt + %d output tokens > max model length %d",
			ErrContextLength, len(req.Prompt), req.MaxTokens, e.cfg.MaxModelLen)
	case e.blocksFor(len(req.Prompt)+req.MaxTokens+e.cfg.SpecTokens) > e.cache.total:
		return ErrTooLarge
	case len(e.waiting) >= e.cfg.MaxWaiting:
		return ErrQueueFull
	}
	if _, ok := e.seqs[req.ID]; ok {
		return fmt.Errorf("%w: %d", ErrDuplicateID, req.ID)
	}
	s := &seq{req: req, arrival: e.clock, numTokens: len(req.Prompt)}
	e.seqs[req.ID] = s
	e.waiting = append(e.waiting, s)
	return nil
}

// Abort removes an active request (a client went away). Its blocks are
// released (at once, or at the end of the step in flight). It reports
// whether the request was active.
func (e *Engine) Abort(id uint64) bool {
	s, ok := e.seqs[id]
	if !ok {
		return false
	}
	delete(e.seqs, id)
	s.aborted = true
	if i := indexOf(e.waiting, s); i >= 0 {
		e.waiting = append(e.waiting[:i], e.waiting[i+1:]...)
	}
	if i := indexOf(e.running, s); i >= 0 {
		e.running = append(e.running[:i], e.running[i+1:]...)
	}
	if !s.inPlan {
		e.release(s)
	}
	return true
}

// Reset drops every request and the whole prefix cache (an engine restart)
// and emits AllBlocksCleared. It returns the ids of the dropped requests in
// no particular order. The clock and the cumulative counters are kept.
func (e *Engine) Reset() []uint64 {
	ids := make([]uint64, 0, len(e.seqs))
	for id := range e.seqs {
		ids = append(ids, id)
	}
	clear(e.seqs)
	e.waiting, e.running, e.plan = e.waiting[:0], e.running[:0], nil
	e.cache.used = 0
	e.cache.clear()
	e.emit(KVEvent{Kind: AllBlocksCleared, At: e.clock})
	return ids
}

// CachedPrefix returns how many leading tokens of prompt would be served
// from the prefix cache if it were admitted now (full blocks only, and at
// most len(prompt)-1 tokens, as vLLM recomputes the last one).
func (e *Engine) CachedPrefix(prompt []uint32) int {
	bs := e.cfg.BlockSize
	var parent uint64
	n := 0
	for i := 0; (i+1)*bs <= len(prompt)-1; i++ {
		h := HashBlock(e.cfg.HashSeed, parent, prompt[i*bs:(i+1)*bs])
		if e.cache.cached.get(h) == nil {
			break
		}
		parent = h
		n += bs
	}
	return n
}

// NextEventTime returns the end of the step in flight, planning one at
// Now() if the engine has work and none is in flight. ok is false when the
// engine is idle.
func (e *Engine) NextEventTime() (t time.Duration, ok bool) {
	if e.plan == nil && e.hasWork() {
		e.startStep()
	}
	if e.plan == nil {
		return 0, false
	}
	return e.plan.end, true
}

// AdvanceTo moves the clock to t (never backwards), completing every step
// that ends by t and starting the steps that follow, and appends the
// per-request events to dst in order.
func (e *Engine) AdvanceTo(t time.Duration, dst []Event) []Event {
	for {
		if e.plan != nil {
			if e.plan.end > t {
				break
			}
			e.clock = e.plan.end
			dst = e.apply(dst)
			continue
		}
		if e.clock < t && e.hasWork() {
			e.startStep()
			if e.plan != nil {
				continue
			}
		}
		break
	}
	e.clock = max(e.clock, t)
	return dst
}

// Step runs the engine to the end of its next step and appends that step's
// events to dst. ok is false when the engine is idle.
func (e *Engine) Step(dst []Event) (_ []Event, ok bool) {
	t, ok := e.NextEventTime()
	if !ok {
		return dst, false
	}
	return e.AdvanceTo(t, dst), true
}

func (e *Engine) hasWork() bool { return len(e.running)+len(e.waiting) > 0 }

func (e *Engine) blocksFor(tokens int) int {
	return (tokens + e.cfg.BlockSize - 1) / e.cfg.BlockSize
}

func (e *Engine) emit(ev KVEvent) {
	if e.sink != nil {
		e.sink(ev)
	}
}

func indexOf(l []*seq, s *seq) int {
	for i, x := range l {
		if x == s {
			return i
		}
	}
	return -1
}

// tokenAt returns token i of the sequence (prompt, then output).
func (s *seq) tokenAt(i int) uint32 {
	if i < len(s.req.Prompt) {
		return s.req.Prompt[i]
	}
	j := i - len(s.req.Prompt)
	if j < len(s.req.Output) {
		return s.req.Output[j]
	}
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], s.req.ID)
	binary.LittleEndian.PutUint64(b[8:], uint64(j))
	return uint32(xxhash.Sum64(b[:]) % VocabSize)
}

// blockTokens returns the tokens of full block i in the engine's scratch.
func (e *Engine) blockTokens(s *seq, i int) []uint32 {
	bs := e.cfg.BlockSize
	if (i+1)*bs <= len(s.req.Prompt) {
		return s.req.Prompt[i*bs : (i+1)*bs]
	}
	e.tokBuf = e.tokBuf[:0]
	for p := i * bs; p < (i+1)*bs; p++ {
		e.tokBuf = append(e.tokBuf, s.tokenAt(p))
	}
	return e.tokBuf
}

// hashAt returns the chain hash of full block i, computing the chain.
func (e *Engine) hashAt(s *seq, i int) uint64 {
	for len(s.hashes) <= i {
		j := len(s.hashes)
		var parent uint64
		if j > 0 {
			parent = s.hashes[j-1]
		}
		s.hashes = append(s.hashes, HashBlock(e.cfg.HashSeed, parent, e.blockTokens(s, j)))
	}
	return s.hashes[i]
}

// release returns a sequence's blocks, last block first, so that the
// deepest blocks of a prefix are evicted before its root.
func (e *Engine) release(s *seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		if b := s.blocks[i]; b != nil {
			e.cache.unref(b)
		} else {
			e.cache.used--
		}
	}
	s.blocks = s.blocks[:0]
	s.nCached = 0
}

// preempt moves a running sequence back to the front of the queue
// (recompute preemption), keeping its cached blocks in the cache.
func (e *Engine) preempt(i int) {
	s := e.running[i]
	e.running = append(e.running[:i], e.running[i+1:]...)
	e.release(s)
	s.computed = 0
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = s
	e.stats.Preemptions++
}

// grow gives s blocks for its first `tokens` token slots, evicting cached
// blocks as needed. It reports false when they do not fit.
func (e *Engine) grow(s *seq, tokens int) bool {
	need := e.blocksFor(tokens) - len(s.blocks)
	if need <= 0 {
		return true
	}
	if !e.cache.canAlloc(need) {
		return false
	}
	e.removed = e.cache.alloc(need, e.removed)
	for ; need > 0; need-- {
		s.blocks = append(s.blocks, nil)
	}
	return true
}

// startStep plans the next step at Now(): decode and continue the running
// sequences in order, then admit waiting ones while slots, token budget and
// blocks allow.
func (e *Engine) startStep() {
	p := &e.spare
	p.items = p.items[:0]
	e.removed = e.removed[:0]
	budget := e.cfg.MaxBatchedTokens
	k := e.cfg.SpecTokens
	for i := 0; i < len(e.running) && budget > 0; {
		s := e.running[i]
		n := s.numTokens - s.computed
		spec := 0
		if n == 1 && s.generated > 0 && k > 0 {
			spec = min(k, s.req.MaxTokens-s.generated-1)
			if n+spec > budget {
				i++
				continue
			}
		}
		n = min(n, budget)
		fits := e.grow(s, s.computed+n+spec)
		for !fits && len(e.running)-1 > i {
			e.preempt(len(e.running) - 1)
			fits = e.grow(s, s.computed+n+spec)
		}
		if !fits {
			e.preempt(i)
			continue
		}
		p.items = append(p.items, planItem{s: s, n: n, spec: spec})
		budget -= n + spec
		i++
	}
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxRunningSeqs && budget > 0 {
		s := e.waiting[0]
		if !e.admit(s, budget) {
			break
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
		n := min(s.numTokens-s.computed, budget)
		p.items = append(p.items, planItem{s: s, n: n})
		budget -= n
	}
	if len(e.removed) > 0 {
		e.emit(KVEvent{Kind: BlockRemoved, At: e.clock, BlockHashes: append([]uint64(nil), e.removed...)})
	}
	if len(p.items) == 0 {
		return
	}
	for _, it := range p.items {
		it.s.inPlan = true
	}
	p.start = e.clock
	p.end = e.clock + e.stepTime(p.items)
	e.plan = p
	e.stats.Steps++
}

// admit looks up s's cached prefix and gives it blocks for its first chunk.
func (e *Engine) admit(s *seq, budget int) bool {
	bs := e.cfg.BlockSize
	hits, inLRU := 0, 0
	for ; (hits+1)*bs <= s.numTokens-1; hits++ {
		b := e.cache.cached.get(e.hashAt(s, hits))
		if b == nil {
			break
		}
		if b.refs == 0 {
			inLRU++
		}
	}
	n := min(s.numTokens-hits*bs, budget)
	need := e.blocksFor(hits*bs+n) - hits
	if e.cache.free()+e.cache.lruLen-inLRU < need {
		return false
	}
	s.blocks = s.blocks[:0]
	for i := 0; i < hits; i++ {
		b := e.cache.cached.get(s.hashes[i])
		e.cache.ref(b)
		s.blocks = append(s.blocks, b)
	}
	s.nCached = hits
	s.computed = hits * bs
	if !e.grow(s, hits*bs+n) {
		panic("engine: admission accounting")
	}
	e.stats.PrefixQueries += uint64(s.numTokens)
	e.stats.PrefixHits += uint64(hits * bs)
	if !s.cachedSet {
		s.cachedSet = true
		s.cachedTokens = hits * bs
	}
	return true
}

// stepTime is the duration of a step computing items.
func (e *Engine) stepTime(items []planItem) time.Duration {
	c := e.cfg
	d := c.StepBase
	spec := 0
	for _, it := range items {
		s := it.s
		d += c.TokenCompute * time.Duration(it.n+it.spec)
		if s.generated > 0 && s.numTokens-s.computed == 1 {
			d += c.KVReadPerToken * time.Duration(s.computed)
		} else {
			n, a := int64(it.n), int64(s.computed)
			d += c.PrefillAttnPerPair * time.Duration(n*a+n*(n-1)/2)
		}
		spec = max(spec, it.spec)
	}
	return d + c.SpecDraftCost*time.Duration(spec)
}

// apply completes the planned step at its end time.
func (e *Engine) apply(dst []Event) []Event {
	p := e.plan
	e.plan = nil
	now := p.end
	for _, it := range p.items {
		s := it.s
		s.inPlan = false
		if s.aborted {
			e.release(s)
			continue
		}
		if len(s.blocks) == 0 {
			continue // preempted after planning cannot happen; defensive
		}
		s.computed += it.n
		newTok := 0
		if s.computed == s.numTokens {
			acc := 0
			if it.spec > 0 {
				for acc < it.spec && e.rng.Float64() < e.cfg.SpecAcceptance {
					acc++
				}
				e.stats.SpecDrafts++
				e.stats.SpecDraftTokens += uint64(it.spec)
				e.stats.SpecAcceptedTokens += uint64(acc)
				for len(e.stats.SpecAcceptedPerPos) < it.spec {
					e.stats.SpecAcceptedPerPos = append(e.stats.SpecAcceptedPerPos, 0)
				}
				for p := range acc {
					e.stats.SpecAcceptedPerPos[p]++
				}
			}
			newTok = 1 + acc
			s.computed += acc
			s.generated += newTok
			s.numTokens += newTok
		}
		e.cacheFull(s, now)
		if newTok == 0 {
			continue
		}
		kind := EventTokens
		if s.firstAt == 0 && s.generated == newTok {
			kind = EventFirstToken
			s.firstAt = now
		}
		ev := Event{
			Kind: kind, ID: s.req.ID, At: now, NewTokens: newTok, Generated: s.generated,
			Usage:   Usage{PromptTokens: len(s.req.Prompt), CachedTokens: s.cachedTokens, CompletionTokens: s.generated},
			Arrival: s.arrival, FirstTokenAt: s.firstAt,
		}
		dst = append(dst, ev)
		if s.generated >= s.req.MaxTokens {
			ev.Kind, ev.NewTokens = EventFinished, 0
			dst = append(dst, ev)
			e.finish(s)
		}
	}
	return dst
}

func (e *Engine) finish(s *seq) {
	if i := indexOf(e.running, s); i >= 0 {
		e.running = append(e.running[:i], e.running[i+1:]...)
	}
	delete(e.seqs, s.req.ID)
	e.release(s)
	e.stats.Finished++
	e.stats.PromptTokens += uint64(len(s.req.Prompt))
	e.stats.GenerationTokens += uint64(s.generated)
}

// cacheFull enters s's newly full computed blocks into the prefix cache and
// emits BlockStored for each run of newly stored blocks. A block whose hash
// is already cached (computed concurrently by another sequence) stays
// private to s and is not announced.
func (e *Engine) cacheFull(s *seq, now time.Duration) {
	bs := e.cfg.BlockSize
	full := min(s.computed/bs, len(s.blocks))
	var ev *KVEvent
	flush := func() {
		if ev != nil {
			e.emit(*ev)
			ev = nil
		}
	}
	for i := s.nCached; i < full; i++ {
		h := e.hashAt(s, i)
		if e.cache.cached.get(h) != nil || s.blocks[i] != nil {
			flush()
			continue
		}
		b := e.cache.newBlock(h)
		e.cache.cached.put(h, b)
		s.blocks[i] = b
		if e.sink == nil {
			continue
		}
		if ev == nil {
			ev = &KVEvent{Kind: BlockStored, At: now, BlockSize: bs}
			if i > 0 {
				ev.ParentHash, ev.HasParent = s.hashes[i-1], true
			}
		}
		ev.BlockHashes = append(ev.BlockHashes, h)
		ev.TokenIDs = append(ev.TokenIDs, e.blockTokens(s, i)...)
	}
	flush()
	s.nCached = max(s.nCached, full)
}
