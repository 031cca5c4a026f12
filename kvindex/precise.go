package kvindex

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/selection"
)

// Defaults of PreciseConfig.
const (
	DefaultPredictTTL   = 5 * time.Minute
	DefaultPredictGrace = 2 * time.Second
	// DefaultQueueEstimate is QueueEstimate's default: a replica whose
	// queue ahead holds at least its whole KV capacity of prefill.
	DefaultQueueEstimate = 1.0
	// DefaultCapForeignQueue is CapForeignQueue's default: a replica
	// whose queue ahead holds at least four times its KV capacity of
	// prefill.
	DefaultCapForeignQueue = 4.0
	// DefaultCapLoad, DefaultCapPeer, DefaultCapGain (scaled by the
	// fleet's saturation, CapGainFleet) and DefaultCapFit are the
	// estimate cap's lift stack, the default since 2026-12-07
	// (bench/EXPERIMENTS.md 114, 118): CapLoad's, CapPeer's, CapGain's
	// and CapFit's values at 0.
	DefaultCapLoad = 3.0
	DefaultCapPeer = 1.1
	DefaultCapGain = 0.75
	DefaultCapFit  = 2.5
)

// PreciseEngine is one replica of the precise path: its feed and the
// engine's HTTP base for the tokenize preflight and the canary.
type PreciseEngine struct {
	// Feed is the replica's event feed; Feed.Replica is the replica key
	// (the router's: dial address, plus "#rank" for a data-parallel rank).
	// Feed.Events empty: no subscriber for it (the simulation applies
	// events itself).
	Feed Endpoint
	// BaseURL is the engine's OpenAI base with its scheme, e.g.
	// "https://10.0.0.5:8000". Empty: neither tokenized at nor probed.
	BaseURL string
	// Header is added to the replica's own requests (e.g.
	// X-data-parallel-rank).
	Header http.Header
}

// PreciseConfig configures a Precise. Zero values take the defaults.
type PreciseConfig struct {
	// Index configures the index (block size, budget, clock).
	Index Config
	// Engines lists the replicas with a feed.
	Engines []PreciseEngine
	// Template, when set, gives a feed to every replica key Bind is
	// given that Engines does not list (template.go); it starts at Bind
	// and stops at Depart.
	Template *TemplateConfig
	// Token, when set, is sent as "Authorization: Bearer <Token>" with
	// every tokenize preflight and canary probe (the upstream token).
	Token string
	// PredictTTL bounds how long a block routed to a replica counts as
	// held there when neither the engine's event confirms it nor the
	// request's end is reported (Ended, Late.End). Default 5m: longer than
	// any queue and prefill, so that a prediction lasts until the
	// engine's events for its request arrive.
	PredictTTL time.Duration
	// PredictGrace is how long a prediction outlives the end of the last
	// request that made it (the engine's BlockStored may still be on the
	// wire). Default 2s.
	PredictGrace time.Duration
	// TokenizeURL, when set, is the base URL of the /tokenize endpoint;
	// by default the BaseURL of a replica whose feed is fresh, in turn.
	TokenizeURL string
	// Tokenizer configures the preflight (timeout, concurrency, cache).
	Tokenizer TokenizerConfig
	// Canary, when Model is set, turns on exact-placement canaries over
	// every engine with a BaseURL.
	Canary CanaryConfig
	// Subscriber configures the feeds.
	Subscriber SubscriberConfig
	// Logger receives the service's logs; default none.
	Logger *zap.Logger
	// ExactPastEstimate, with SetEstimate, credits a candidate its exact
	// overlap even where the router's approximate estimate credits it with
	// less (the precise path before the estimate cap). By default such a
	// candidate is routed by the estimate (see SetEstimate, CapQueue).
	ExactPastEstimate bool
	// CapForeign leaves to the estimate also the candidates whose blocks
	// past the estimate came from traffic this router did not route. For
	// a single router it measured best (agent-fleet at 8 replicas); with
	// several routers it discards what each learns from the others'
	// placements (bench/RESULTS.md, 2026-12-02).
	CapForeign bool
	// QueueEstimate, with SetEstimate, leaves to the estimate a candidate
	// whose exact overlap is below the estimate's credit (the engine has
	// evicted what the estimate believes it holds) while the replica's
	// pending prefill (the router's requests there not yet past their
	// first token) is at least QueueEstimate times its KV capacity as the
	// router knows it (Router.Capacity; unknown: never). The engine's
	// events say what it holds now; the request runs after that queue,
	// which rewrites more than the whole cache first and recomputes what
	// its own requests share with this one, as the estimate (learned in
	// routing order, bounded by the capacity) models. 0 is
	// DefaultQueueEstimate, negative off (every exact overlap below the
	// estimate decides, the rule before 2026-12-07). bench/EXPERIMENTS.md
	// section 99.
	QueueEstimate float64
	// CapQueue, with SetEstimate, CapLoad off (negative) and CapQueue positive,
	// bounds the estimate cap to queued replicas: a candidate whose exact overlap exceeds the
	// estimate's credit on blocks this router routed there keeps its
	// exact overlap while the replica's pending prefill is below CapQueue
	// times its KV capacity as the router knows it (Router.Capacity;
	// unknown: capped), and is left to the estimate past it. The mirror of
	// QueueEstimate: the estimate dropped those blocks for the capacity of
	// what the router sent since, but without a cache's worth of queue
	// ahead the engine still holds them when the request runs. 0 or
	// negative (the default): the cap everywhere. Opt-in: at 1 it gained
	// agent-fleet 0.12-0.13 of cached share at 8 replicas and cost the
	// overloaded tool-agent traces' held-out TTFT p99 8% (bench/
	// EXPERIMENTS.md section 103).
	CapQueue float64
	// CapLoad, with SetEstimate, bounds the estimate cap by the replica's
	// load in cache units: a candidate whose exact overlap exceeds the
	// estimate's credit on blocks this router routed there keeps its
	// exact overlap while the replica's in-flight requests and this one,
	// each weighed as this request's prompt, fit in CapLoad times its KV
	// capacity as the router knows it ((in-flight + 1) x prompt tokens <
	// CapLoad x Router.Capacity; unknown: capped). It counts requests
	// decoding as well as queued: each holds a context in the cache the
	// request's blocks must survive until it runs. 0 is DefaultCapLoad
	// (with CapPeer's, CapGain's and CapFit's defaults, the lift stack:
	// bench/EXPERIMENTS.md sections 114 and 118), negative off (then
	// CapQueue decides; without it the cap everywhere, the rule before
	// 2026-12-07). Alone at 3 it recovers agent-fleet's 0.07-0.13 of
	// cached share at 8 replicas and is neutral on the overloaded
	// tool-agent traces, but costs agent-fleet at a half or a quarter of
	// its load with 65,536-131,072-token caches TTFT p95 8-18% and output
	// 2-4% (bench/EXPERIMENTS.md section 104), which CapPeer, CapGain and
	// CapFit remove.
	CapLoad float64
	// CapPeer, with CapLoad on, lifts the estimate cap only on a replica
	// no busier than its peers: an exact overlap past the estimate's
	// credit on blocks this router routed there (and within CapLoad)
	// stands only while the replica's resident context (Router.Resident:
	// the contexts its in-flight requests keep) is at most CapPeer times
	// the mean over the decision's candidates. Where the fleet is loaded
	// evenly, moving the request away buys no shorter queue and its
	// context evicts another replica's conversations, so the exact
	// overlap pays; where its home is busier than the others, keeping the
	// request there makes it a magnet that queues it and its neighbours
	// (bench/EXPERIMENTS.md section 107). 0 is DefaultCapPeer, negative
	// off (CapLoad alone decides).
	CapPeer float64
	// CapPeerInflight, with CapPeer, compares the in-flight request counts
	// (Router.Load) instead of the resident contexts: a probe.
	CapPeerInflight bool
	// CapForeignQueue, with SetEstimate, leaves to the estimate also a
	// candidate whose exact overlap past the estimate's credit is on
	// blocks this router did not route there (other routers' and
	// clients' traffic, the engine's own output, own blocks the
	// own-block memory forgot) while the replica's pending prefill (the
	// router's requests there not yet past their first token) is at
	// least CapForeignQueue times its KV capacity as the router knows it
	// (Router.Capacity; unknown: kept): that queue rewrites the cache
	// several times before the request runs, so the engine no longer
	// holds what its events show now (on the overloaded tool-agent
	// traces at 8 x 65,536 it held 0.40 of such an overlap past 4 caches
	// of queue), and the overlap only draws the conversation to a
	// replica it makes the fleet's last to finish. 0 is
	// DefaultCapForeignQueue, negative off (the foreign exact overlaps
	// stand unless CapForeign: the rule before 2026-12-07).
	// bench/EXPERIMENTS.md section 110.
	CapForeignQueue float64
	// CapGain, with CapLoad, lifts the estimate cap only where the lift
	// saves more prefill than the home's queue adds: the replica's
	// pending prefill (Router.Load) less the least pending prefill among
	// the decision's other candidates is below CapGain times the tokens
	// the exact overlap credits past the estimate's. Kept at home, the
	// request waits behind that queue difference to save those tokens;
	// sent to the least queued peer, the estimate's credit is what it
	// reads. 0 is DefaultCapGain with CapGainFleet (set or not), negative
	// off. At 1 (unscaled) with CapPeer 1.1 it removed
	// CapPeer's half-load TTFT p95 loss on held-out agent-fleet seeds and
	// kept about 3/4 of the full-load gain, but cost 0.5 x 65,536 TTFT p50
	// 2% (bench/EXPERIMENTS.md section 111).
	CapGain float64
	// CapGainMean, with CapGain, compares the replica's pending prefill
	// with the candidates' mean instead of the least other's: a probe.
	CapGainMean bool
	// CapGainFleet, with CapGain, scales CapGain by the candidates' mean
	// resident context over their mean KV capacity (how saturated the
	// fleet is; JSON kv.cap_gain_fleet; implied with CapGain 0). At CapGain 0.75 with
	// CapPeer 1.1 it kept the full-load gain and removed CapPeer's
	// half-load tail, but read 65,536-token caches as saturated
	// (bench/EXPERIMENTS.md 111; CapFit, 114).
	CapGainFleet bool
	// CapGainRoom, with CapGainFleet, also scales CapGain by the room the
	// replica's KV capacity leaves beside this request's prompt, in
	// prompts: (capacity - tokens) / tokens, within 0..1. A cache that
	// cannot keep another context of this size beside it keeps little of
	// the conversations the request would evict elsewhere: a probe.
	CapGainRoom bool
	// CapFit, with CapLoad, lifts the estimate cap only on a replica
	// whose KV capacity holds CapFit times the request's prompt (tokens
	// x CapFit <= Router.Capacity; unknown: capped). The lift pays where
	// the cache keeps other conversations beside the prompt, which the
	// cap's move would evict on another replica; a cache the prompt
	// mostly fills keeps none, and there the lift only loads the home.
	// 0 is DefaultCapFit, negative off. At 2.5 with CapPeer 1.1, CapGain
	// 0.75 and CapGainFleet it kept CapGainFleet's held-out full-load gain
	// on agent-fleet (+0.081 of cached share) and was identical to the cap
	// at 0.5 x 65,536 (bench/EXPERIMENTS.md section 114).
	CapFit float64
	// CapPeerSlack, with CapPeer, also requires the replica's in-flight
	// requests to be fewer than the candidates' mean plus CapPeerSlack:
	// a probe (0 or negative: off).
	CapPeerSlack float64
	// WaitAuto turns the wait rule on (diverge.go; tokenize_wait auto,
	// Settings' default). Without it (the zero value, tokenize_wait
	// always) every request without a cached message prefix waits for its
	// preflight and every chat with one is routed on its tokens.
	WaitAuto bool
	// WaitWarm (tokenize_wait warm, opt-in), with WaitAuto: a lone
	// instance waits only for a request the estimate credits to some
	// replica (WaitFor).
	WaitWarm bool
}

// TemplateConfig is a feed template with what its expansion needs.
type TemplateConfig struct {
	// Feed is the template (Upstream TemplateUpstream).
	Feed FeedSpec
	// Topic is the default topic; RankHeader carries a data-parallel
	// rank on the replica's own requests.
	Topic, RankHeader string
}

// Precise is the precise path as one service: the index, the subscribers
// that feed it, the tokenizer for the preflight and the optional canary.
// It implements selection.Annotator: Route asks it for the exact overlap of
// every candidate whose feed is fresh, from the token ids the preflight
// produced, and tells it the decision so that the chosen replica's blocks
// count as predicted entries until the engine's events confirm them.
//
// Start starts the feeds and the canary; Close stops them. Safe for
// concurrent use.
type Precise struct {
	cfg    PreciseConfig
	x      *Index
	sub    *Subscriber // nil without feeds to dial
	tk     *Tokenizer
	canary *Canary // nil unless configured
	bases  atomic.Pointer[[]preciseBase]
	static []preciseBase // Engines' bases
	next   atomic.Uint32

	// The template's feeds (Bind starts, Depart stops), under mu; they
	// run under dynCtx until Close.
	dyn     map[string]*dynFeed
	dynBad  map[string]bool // keys the template did not expand for (logged once)
	dynCtx  context.Context
	dynStop context.CancelFunc
	dynWG   sync.WaitGroup

	// bySlot maps a selection.Slot to its Replica plus one (0: unbound).
	bySlot [selection.MaxReplicas]atomic.Int32

	precise, approx atomic.Uint64
	// late counts preflights that missed their timeout by outcome (see
	// LateOutcomes).
	late [numLate]atomic.Uint64
	// waited and waitNanos count the preflights a request waited for
	// (not answered from the cache) and the time requests spent waiting.
	waited    atomic.Uint64
	waitNanos atomic.Int64
	keys      sync.Pool // of *[]uint64, for Ended
	est       atomic.Pointer[estimate]
	estWork   sync.Pool                                // of *estimateWork
	foreign   atomic.Pointer[selection.ForeignPrefill] // SetForeign (stored.go)
	pfx       prefixTrust
	div       divergence // the wait rule's record (diverge.go)

	mu      sync.Mutex
	started bool
	closed  bool
}

// estimate is the router's approximate index, as SetEstimate gave it.
type estimate struct {
	x   *selection.Index
	cfg selection.Config
	rt  *selection.Router
}

type estimateWork struct {
	interest selection.SlotSet
	depth    [selection.MaxReplicas]int32
	s        *selection.Scratch
}

// SetEstimate gives the service the router's approximate index (rt's, which
// Retune keeps, and its shape: block size, prefix bound, characters per
// token). Annotate then leaves to the estimate every candidate that the
// estimate credits with less than its exact overlap on blocks this router
// routed there (Precise cleared, so that Pick reads the estimate and
// Observe corrects it as on the default path), unless ExactPastEstimate,
// or the replica's load is under CapLoad (by default, with CapPeer, CapGain
// and CapFit) or CapQueue (opt-in). The exact overlap still decides
// where it is the lower one (the engine evicted what the estimate
// believes) unless the queue rule (QueueEstimate) says otherwise, and
// predictions are still made. Why: the estimate learns a request's blocks
// at the decision and bounds each replica by its capacity, so it already
// drops what the requests queued ahead will evict, while the engine's
// events only say what it holds now; on a fleet whose contexts outgrow its
// KV, the exact overlap keeps a conversation on a replica that will have
// evicted it by the time the request runs (bench/RESULTS.md, 2026-12-02;
// the tool-agent traces at 8 x 65,536 tokens, where lifting it costs TTFT
// p99 18%). On agent-fleet at 8 replicas of the default KV it costs
// 0.075-0.13 of cached share, which CapLoad recovers there but not
// without a cost at lower loads with small caches (bench/EXPERIMENTS.md
// sections 103, 104) that its stack's defaults remove (114, 118). nil
// turns it off.
func (p *Precise) SetEstimate(rt *selection.Router) {
	if rt == nil {
		p.est.Store(nil)
		return
	}
	p.est.Store(&estimate{x: rt.Index(), cfg: rt.Config(), rt: rt})
}

// dynFeed is one running template feed.
type dynFeed struct {
	r      Replica
	base   preciseBase
	cancel context.CancelFunc
}

type preciseBase struct {
	r   Replica
	url string
	hdr http.Header
}

var _ selection.Annotator = (*Precise)(nil)

// NewPrecise returns the service for cfg, not started.
func NewPrecise(cfg PreciseConfig) (*Precise, error) {
	if cfg.PredictTTL <= 0 {
		cfg.PredictTTL = DefaultPredictTTL
	}
	if cfg.PredictGrace <= 0 {
		cfg.PredictGrace = DefaultPredictGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.CapLoad == 0 {
		cfg.CapLoad = DefaultCapLoad
	}
	if cfg.CapPeer == 0 {
		cfg.CapPeer = DefaultCapPeer
	}
	if cfg.CapGain == 0 {
		cfg.CapGain, cfg.CapGainFleet = DefaultCapGain, true
	}
	if cfg.CapFit == 0 {
		cfg.CapFit = DefaultCapFit
	}
	var auth http.Header
	if cfg.Token != "" {
		auth = http.Header{"Authorization": {"Bearer " + cfg.Token}}
	}
	p := &Precise{cfg: cfg, x: New(cfg.Index), dyn: map[string]*dynFeed{}, dynBad: map[string]bool{}}
	p.dynCtx, p.dynStop = context.WithCancel(context.Background())
	var feeds []Endpoint
	for _, e := range cfg.Engines {
		if e.Feed.Replica == "" {
			return nil, errors.New("kvindex: precise engine without a replica key")
		}
		r, err := p.x.Register(e.Feed.Replica)
		if err != nil {
			return nil, err
		}
		if e.Feed.Events != "" {
			feeds = append(feeds, e.Feed)
		}
		if e.BaseURL != "" {
			if !strings.HasPrefix(e.BaseURL, "http://") && !strings.HasPrefix(e.BaseURL, "https://") {
				return nil, fmt.Errorf("kvindex: base URL %q: want http:// or https://", e.BaseURL)
			}
			p.static = append(p.static, preciseBase{r: r, url: e.BaseURL, hdr: e.Header})
		}
	}
	p.bases.Store(&p.static)
	if len(feeds) > 0 || cfg.Template != nil {
		sc := cfg.Subscriber
		if sc.Logger == nil {
			sc.Logger = cfg.Logger
		}
		sub, err := NewSubscriber(p.x, feeds, sc)
		if err != nil {
			return nil, err
		}
		p.sub = sub
	}
	tc := cfg.Tokenizer
	tc.Header = mergeHeader(tc.Header, auth)
	if t := cfg.Template; t != nil && tc.Resolver == nil {
		// The template's engines are reached by name like their feeds.
		tc.Resolver = dnsResolver(t.Feed.Resolvers)
	}
	p.tk = NewTokenizer(tc)
	if cfg.Canary.Model != "" {
		cc := cfg.Canary
		cc.Header = mergeHeader(cc.Header, auth)
		if cc.Client == nil && tc.Resolver != nil {
			cc.Client = &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{Resolver: tc.Resolver}).DialContext}}
		}
		c, err := newCanary(p.x, cc)
		if err != nil {
			return nil, err
		}
		if c.setTargets(p.static); len(p.static) == 0 && cfg.Template == nil {
			return nil, errors.New("kvindex: canary needs at least one target")
		}
		p.canary = c
	}
	return p, nil
}

func mergeHeader(a, b http.Header) http.Header {
	if len(b) == 0 {
		return a
	}
	out := a.Clone()
	if out == nil {
		out = make(http.Header, len(b))
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// Start starts the feeds and the canary; they run until Close (or ctx
// ends). Calling it again does nothing.
func (p *Precise) Start(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.closed {
		return
	}
	p.started = true
	if p.sub != nil {
		p.sub.Start(ctx)
	}
	if p.canary != nil {
		p.canary.Start(ctx)
	}
}

// Close stops the feeds (the template's too) and the canary and waits for
// them.
func (p *Precise) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.dynStop()
	p.dynWG.Wait()
	var err error
	if p.canary != nil {
		err = p.canary.Close()
	}
	if p.sub != nil {
		err = errors.Join(err, p.sub.Close())
	}
	p.tk.CloseIdle()
	return err
}

// Index is the service's index.
func (p *Precise) Index() *Index { return p.x }

// Tokenizer is the service's preflight client.
func (p *Precise) Tokenizer() *Tokenizer { return p.tk }

// Canary is the service's canary, nil unless configured.
func (p *Precise) Canary() *Canary { return p.canary }

// Subscriber is the service's feeds, nil when there are none to dial.
func (p *Precise) Subscriber() *Subscriber { return p.sub }

// Bind maps the router's slot s to the replica key key. It reports whether
// key has a feed; candidates of slots without one are routed by the
// estimate. With a template, a key without a feed gets one, started at
// once (cold), until Depart or Close. Bind before routing over s;
// rebinding is allowed.
func (p *Precise) Bind(s selection.Slot, key string) bool {
	if s < 0 || int(s) >= len(p.bySlot) {
		return false
	}
	r, ok := p.x.Lookup(key)
	if !ok && p.cfg.Template != nil {
		r, ok = p.startFeed(key)
	}
	if !ok {
		p.bySlot[s].Store(0)
		return false
	}
	p.bySlot[s].Store(int32(r) + 1)
	return true
}

func (p *Precise) replicaOf(s selection.Slot) Replica {
	if s < 0 || int(s) >= len(p.bySlot) {
		return -1
	}
	return Replica(p.bySlot[s].Load() - 1)
}

// Ready reports whether a preflight is worth sending: some feed is fresh,
// so that token ids can give an exact overlap.
func (p *Precise) Ready() bool {
	for r := range p.x.NumReplicas() {
		if p.x.Fresh(Replica(r)) {
			return true
		}
	}
	return false
}

// Tokenize is the preflight: the token ids of req as an engine tokenizes
// it, from the cache when key was seen (key: e.g. a hash of the body),
// bounded by the tokenizer's timeout and concurrency. The engine is
// TokenizeURL, or else an engine whose feed is fresh, taken in turn. The
// returned slice is shared: do not modify it.
func (p *Precise) Tokenize(ctx context.Context, key uint64, req TokenizeRequest) ([]uint32, error) {
	if toks, ok := p.tk.Cached(key); ok {
		return toks, nil
	}
	base, err := p.tokenizeBase(true)
	if err != nil {
		return nil, err
	}
	return p.tk.Tokenize(ctx, base, key, req)
}

// tokenizeBase is the engine base URL to tokenize at: TokenizeURL, or an
// engine in turn, one whose feed is fresh when fresh is set (the cold
// start's preflight, ColdPreflight, takes any: none is fresh yet).
func (p *Precise) tokenizeBase(fresh bool) (string, error) {
	if p.cfg.TokenizeURL != "" {
		return p.cfg.TokenizeURL, nil
	}
	bases := *p.bases.Load()
	n := len(bases)
	start := int(p.next.Add(1))
	for i := range n {
		b := bases[(start+i)%n]
		if !fresh || p.x.Fresh(b.r) {
			return b.url, nil
		}
	}
	return "", errors.New("kvindex: no fresh feed to tokenize at")
}

// Waited reports how many requests waited for a preflight in flight
// (Preflight: not answered from the cache) and the time they spent
// waiting in all: the latency the precise path adds ahead of routing.
func (p *Precise) Waited() (n uint64, total time.Duration) {
	return p.waited.Load(), time.Duration(p.waitNanos.Load())
}

// Decisions counts the routing decisions annotated with at least one
// exact overlap, and those routed by the estimate alone.
func (p *Precise) Decisions() (precise, approx uint64) {
	return p.precise.Load(), p.approx.Load()
}

// Annotate implements selection.Annotator: it sets the exact overlap of
// s.Tokens on every candidate whose slot is bound to a fresh feed and
// clears Precise on the others. It does not allocate once s.Exact and
// s.Keys have grown.
func (p *Precise) Annotate(f *selection.Features, cands []selection.Candidate, s *selection.Scratch) bool {
	if len(s.Tokens) == 0 {
		for i := range cands {
			cands[i].Precise = false
		}
		p.approx.Add(1)
		return false
	}
	s.Keys = p.x.Keys(s.Keys[:0], 0, s.Tokens)
	if cap(s.Exact) < MaxReplicas {
		s.Exact = make([]int, MaxReplicas)
	}
	s.Exact = s.Exact[:MaxReplicas]
	x := p.x
	x.mu.RLock()
	x.overlapLocked(s.Keys, s.Exact)
	n := 0
	for i := range cands {
		r := p.replicaOf(cands[i].Slot)
		if r < 0 || int(r) >= len(x.reps) || !x.fresh.has(r) {
			cands[i].Precise = false
			continue
		}
		cands[i].Precise, cands[i].Overlap = true, s.Exact[r]
		n++
	}
	x.mu.RUnlock()
	if n == 0 {
		p.approx.Add(1)
		return false
	}
	if e := p.est.Load(); e != nil {
		onGrid(e.cfg.BlockTokens, cands)
		if !p.cfg.ExactPastEstimate && f != nil {
			p.noteDiverged(p.capByEstimate(e, f, cands, s.Keys, len(s.Tokens)))
		}
	}
	p.precise.Add(1)
	return true
}

// onGrid rounds every exact overlap down to whole router blocks of bt
// tokens, the grain of the estimate that Pick reads for the other
// candidates (and for these when capByEstimate leaves them to it). The
// engine's blocks are smaller (16 tokens against 64): unrounded, a replica
// whose feed shows a shared 20,000-token prefix exactly would hold 32
// tokens more than one the estimate credits with the same prefix (19,968),
// which makes it the request's home (strictly the deepest: exempt from the
// pair term) and every other pick a load override open to the spill, on a
// difference of less than one block that nothing holds against it
// (bench/EXPERIMENTS.md, precise9).
func onGrid(bt int, cands []selection.Candidate) {
	if bt <= 1 {
		return
	}
	for i := range cands {
		if c := &cands[i]; c.Precise {
			c.Overlap -= c.Overlap % bt
		}
	}
}

// capByEstimate leaves to the estimate every precise candidate whose exact
// overlap exceeds the estimate's where this router routed the first block
// past the estimate's (Index.Own), or where it did not but the replica's
// queue is past CapForeignQueue (foreignQueued), unless the replica's load
// is under CapLoad or CapQueue (queuedUnder, with CapPeer's peerUnder and
// CapGain's gainOver when set), compared in the request's real tokens (the estimate counts tokens
// estimated from bytes). A candidate the estimate credits with the whole
// fingerprinted prefix of a longer prompt keeps its exact overlap: the
// estimate cannot see further. One whose exact overlap is below the
// estimate's credit keeps it unless its replica's queue is past
// QueueEstimate (queuedPast): then the estimate decides. It reports whether a kept exact overlap
// differs from the estimate's credit by more than one router block (the
// wait rule, diverge.go): only then can the decision differ from the
// estimate's.
func (p *Precise) capByEstimate(e *estimate, f *selection.Features, cands []selection.Candidate, keys []uint64, tokens int) (diverged bool) {
	est := f.PromptTokens(e.cfg)
	if est <= 0 || len(f.Blocks) == 0 {
		for i := range cands {
			if cands[i].Precise && cands[i].Overlap > 0 {
				return true
			}
		}
		return false
	}
	w, _ := p.estWork.Get().(*estimateWork)
	if w == nil {
		w = &estimateWork{s: selection.NewScratch(0)}
	}
	clear(w.interest[:])
	for i := range cands {
		if c := &cands[i]; c.Precise {
			w.interest[c.Slot>>6] |= 1 << (uint(c.Slot) & 63)
			w.depth[c.Slot] = 0
		}
	}
	e.x.DepthsWith(f.Blocks, &w.interest, &w.depth, w.s)
	bs := p.x.cfg.BlockSize
	slack := tokensOf(1, e, tokens, est)
	peers := int64(-1) // the candidates' load sum for peerUnder, summed once when first asked
	for i := range cands {
		c := &cands[i]
		if !c.Precise {
			continue
		}
		d := int(w.depth[c.Slot])
		if f.Truncated && d == len(f.Blocks) {
			diverged = diverged || c.Overlap-tokensOf(d, e, tokens, est) > slack
			continue
		}
		credit := tokensOf(d, e, tokens, est)
		if credit >= c.Overlap {
			if credit-c.Overlap > slack && p.queuedPast(e.rt, c.Slot) {
				c.Precise = false // the queue runs first: the estimate's view
				continue
			}
			diverged = diverged || credit-c.Overlap > slack // evicted
			continue
		}
		// The block one router block past the estimate's credit (the
		// estimate counts whole router blocks, the engine smaller ones): if
		// this router routed it there, the estimate dropped it (capacity,
		// horizon) and is trusted; if not, the engine got it from traffic
		// the router did not route (other routers and clients, or the
		// previous answer's own output), which the estimate cannot know.
		if b := (credit + slack) / bs; (p.cfg.CapForeign || b < len(keys) && p.x.Own(p.replicaOf(c.Slot), keys[b]) || p.foreignQueued(e.rt, c.Slot)) && !(p.queuedUnder(e.rt, c.Slot, tokens) && p.peerUnder(e.rt, c.Slot, cands, &peers) && p.gainOver(e.rt, c.Slot, cands, c.Overlap-credit, tokens)) {
			c.Precise = false // Pick reads the estimate; Observe corrects it
		} else if c.Overlap-credit > slack {
			diverged = true // blocks this router did not route
		}
	}
	p.estWork.Put(w)
	return diverged
}

// queuedPast reports whether slot s's pending prefill on rt is at least
// QueueEstimate times its KV capacity (never when the capacity is not
// known or the rule is off).
func (p *Precise) queuedPast(rt *selection.Router, s selection.Slot) bool {
	return queuedCaches(rt, s, p.cfg.QueueEstimate, DefaultQueueEstimate)
}

// foreignQueued reports whether slot s's pending prefill on rt is at
// least CapForeignQueue times its KV capacity (never when the capacity is
// not known or the gate is off): an exact overlap past the estimate on
// blocks this router did not route is then left to the estimate too.
func (p *Precise) foreignQueued(rt *selection.Router, s selection.Slot) bool {
	return queuedCaches(rt, s, p.cfg.CapForeignQueue, DefaultCapForeignQueue)
}

// queuedCaches reports whether slot s's pending prefill on rt is at least
// k times its KV capacity (k 0: def; negative: never; never without a
// queue, where the engine's state now is what the request will find, or
// when the capacity is not known).
func queuedCaches(rt *selection.Router, s selection.Slot, k, def float64) bool {
	if k == 0 {
		k = def
	}
	if k < 0 {
		return false
	}
	_, pend := rt.Load(s)
	if pend <= 0 {
		return false
	}
	capa := rt.Capacity(s)
	return capa > 0 && float64(pend) >= k*float64(capa)
}

// queuedUnder reports whether slot s's in-flight requests on rt and this
// one (tokens each) fit in CapLoad times its KV capacity, or with CapLoad
// off whether its pending prefill is below CapQueue times it (never when
// the capacity is not known or both are off): an exact overlap past the
// estimate then stands.
func (p *Precise) queuedUnder(rt *selection.Router, s selection.Slot, tokens int) bool {
	k, kl := p.cfg.CapQueue, p.cfg.CapLoad
	if k <= 0 && kl <= 0 {
		return false
	}
	capa := rt.Capacity(s)
	if capa <= 0 {
		return false
	}
	inf, pend := rt.Load(s)
	if kl > 0 {
		return float64(inf+1)*float64(tokens) < kl*float64(capa)
	}
	return float64(pend) < k*float64(capa)
}

// peerUnder reports whether slot s is no busier than CapPeer times the
// mean of cands (resident context, or in-flight requests with
// CapPeerInflight); always with CapPeer off. *sum caches the candidates'
// sum for one decision (negative: not summed yet).
func (p *Precise) peerUnder(rt *selection.Router, s selection.Slot, cands []selection.Candidate, sum *int64) bool {
	k := p.cfg.CapPeer
	if k <= 0 || len(cands) == 0 {
		return true
	}
	busy := func(s selection.Slot) int64 {
		if p.cfg.CapPeerInflight {
			n, _ := rt.Load(s)
			return n
		}
		return rt.Resident(s)
	}
	if *sum < 0 {
		*sum = 0
		for i := range cands {
			*sum += busy(cands[i].Slot)
		}
	}
	return float64(busy(s))*float64(len(cands)) <= k*float64(*sum)
}

// gainOver reports whether lifting the estimate cap on slot s saves more
// prefill than the queue it keeps the request behind: s's pending prefill
// less the least among the other candidates' is below CapGain times gain
// (the tokens the exact overlap credits past the estimate's), and with
// CapPeerSlack s has fewer in-flight requests than the candidates' mean
// plus it, and with CapFit s's capacity holds CapFit times the prompt
// (tokens). Always with all three off.
func (p *Precise) gainOver(rt *selection.Router, s selection.Slot, cands []selection.Candidate, gain, tokens int) bool {
	if f := p.cfg.CapFit; f > 0 && f*float64(tokens) > float64(rt.Capacity(s)) {
		return false
	}
	kg, ks := p.cfg.CapGain, p.cfg.CapPeerSlack
	if kg <= 0 && ks <= 0 {
		return true
	}
	inf, pend := rt.Load(s)
	least, sum, psum, res, capa := int64(-1), int64(0), int64(0), int64(0), int64(0)
	for i := range cands {
		n, q := rt.Load(cands[i].Slot)
		sum, psum = sum+n, psum+q
		if p.cfg.CapGainFleet {
			res, capa = res+rt.Resident(cands[i].Slot), capa+rt.Capacity(cands[i].Slot)
		}
		if cands[i].Slot != s && (least < 0 || q < least) {
			least = q
		}
	}
	if p.cfg.CapGainMean {
		least = psum / int64(len(cands))
	}
	if p.cfg.CapGainFleet && capa > 0 {
		kg *= float64(res) / float64(capa)
		if p.cfg.CapGainRoom && tokens > 0 {
			r := float64(rt.Capacity(s)-int64(tokens)) / float64(tokens)
			if r <= 0 {
				return false // no room beside the prompt
			}
			kg *= min(1, r)
		}
	}
	if kg > 0 && least >= 0 && float64(pend-least) >= kg*float64(gain) {
		return false
	}
	return ks <= 0 || float64(inf)*float64(len(cands)) < float64(sum)+ks*float64(len(cands))
}

// tokensOf is d of the estimate's router blocks in the request's real
// tokens (the estimate counts est tokens estimated from bytes, the
// request has tokens).
func tokensOf(d int, e *estimate, tokens, est int) int {
	return int(int64(d) * int64(e.cfg.BlockTokens) * int64(tokens) / int64(est))
}

// Decided implements selection.Annotator: the chosen replica's blocks
// count as held there until its events confirm them, or until the request
// ends (Ended) and PredictGrace passes, at most PredictTTL.
func (p *Precise) Decided(_ *selection.Features, cands []selection.Candidate, d selection.Decision, s *selection.Scratch) {
	if d.Index < 0 || d.Index >= len(cands) {
		return
	}
	if r := p.replicaOf(cands[d.Index].Slot); r >= 0 {
		p.x.Hold(r, s.Keys, p.cfg.PredictTTL)
	}
}

// Ended reports the end of a request that Route decided with the precise
// path (Decision.Precise) on slot s from tokens: the predictions its
// Decided made now live PredictGrace more unless confirmed. Call it once
// per such decision, and for no other request.
func (p *Precise) Ended(s selection.Slot, tokens []uint32) {
	r := p.replicaOf(s)
	if r < 0 || len(tokens) == 0 {
		return
	}
	bp, _ := p.keys.Get().(*[]uint64)
	if bp == nil {
		bp = new([]uint64)
	}
	*bp = p.x.Keys((*bp)[:0], 0, tokens)
	p.x.Release(r, *bp, p.cfg.PredictGrace)
	p.keys.Put(bp)
}
