package module

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

// KVConfig turns on the precise index (package kvindex) for the ramjet
// policy: the engines' own KV-cache events say which replica holds which
// blocks, a /tokenize preflight turns each request into token ids, and the
// exact overlap replaces the estimate for every replica whose event feed is
// healthy. Replicas without a healthy feed, and requests the preflight
// cannot tokenize in time, are routed by the estimate as before.
type KVConfig struct {
	// Engines lists the event feeds, one entry per engine.
	Engines []KVEngine `json:"engines,omitempty"`

	// Topic is the subscription prefix of every feed (vLLM's "topic");
	// empty subscribes to every message.
	Topic string `json:"topic,omitempty"`

	// BlockSize is the engines' KV-cache block size in tokens (vLLM
	// --block-size). Default: 16.
	BlockSize int `json:"block_size,omitempty"`

	// MaxEntries bounds the precise index: (replica, block) entries over
	// all replicas, about 160 bytes each. Default: 1048576.
	MaxEntries int `json:"max_entries,omitempty"`

	// PredictTTL is how long a block just routed to a replica counts as
	// held there before the engine's event confirms it. Default: 2s.
	PredictTTL caddy.Duration `json:"predict_ttl,omitempty"`

	// TokenizeTimeout bounds the /tokenize preflight of one request; past
	// it the request is routed by the estimate. Default: 100ms.
	TokenizeTimeout caddy.Duration `json:"tokenize_timeout,omitempty"`

	// TokenizeConcurrency bounds the preflights in flight; past it
	// requests are routed by the estimate at once. Default: 64.
	TokenizeConcurrency int `json:"tokenize_concurrency,omitempty"`

	// TokenizeCache bounds the cached tokenizations. Default: 4096.
	TokenizeCache int `json:"tokenize_cache,omitempty"`

	// TokenizeURL is the base URL of the /tokenize endpoint, e.g.
	// "http://10.0.0.5:8000". Default: "http://" plus the dial address of
	// a usable replica with a healthy feed.
	TokenizeURL string `json:"tokenize_url,omitempty"`

	// Canary, when set, turns on exact-placement canaries: periodically a
	// one-token completion of a known prompt goes to one replica in turn,
	// and the engine's cached_tokens is compared with the index's
	// prediction (ramjet_kv_canary_accuracy). Engines must report
	// usage.prompt_tokens_details (vLLM --enable-prompt-tokens-details).
	Canary *KVCanary `json:"canary,omitempty"`
}

// KVCanary configures the exact-placement canaries.
type KVCanary struct {
	// Model is the model name the probes ask for. Required.
	Model string `json:"model"`
	// Interval is the time between two probes. Default: 30s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Blocks is the probe prompt's length in blocks. Default: 4.
	Blocks int `json:"blocks,omitempty"`
}

// KVEngine is one engine's event feed.
type KVEngine struct {
	// Upstream is the engine's dial address exactly as in the upstream
	// list, e.g. "10.0.0.5:8000".
	Upstream string `json:"upstream"`
	// Events is the rank-0 PUB address, e.g. "tcp://10.0.0.5:5557"; rank r
	// publishes on its port plus r, as vLLM does.
	Events string `json:"events"`
	// Replay is the rank-0 replay ROUTER address, e.g.
	// "tcp://10.0.0.5:5558" (optional; strongly recommended).
	Replay string `json:"replay,omitempty"`
	// Ranks is the number of data-parallel ranks (the upstream is then
	// listed that many times). Default: 1.
	Ranks int `json:"ranks,omitempty"`
}

func (c *KVConfig) setDefaults() {
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 1 << 20
	}
	if c.PredictTTL == 0 {
		c.PredictTTL = caddy.Duration(2 * time.Second)
	}
	if c.TokenizeTimeout == 0 {
		c.TokenizeTimeout = caddy.Duration(100 * time.Millisecond)
	}
	if c.TokenizeConcurrency == 0 {
		c.TokenizeConcurrency = 64
	}
	if c.TokenizeCache == 0 {
		c.TokenizeCache = 4096
	}
	for i := range c.Engines {
		if c.Engines[i].Ranks == 0 {
			c.Engines[i].Ranks = 1
		}
	}
}

// validate rejects unusable settings, naming the field.
func (c *KVConfig) validate() error {
	switch {
	case len(c.Engines) == 0:
		return fmt.Errorf("kv: engines must list at least one event feed")
	case c.BlockSize < 0:
		return fmt.Errorf("kv: block_size must be positive, got %d", c.BlockSize)
	case c.MaxEntries < 0:
		return fmt.Errorf("kv: max_entries must be positive, got %d", c.MaxEntries)
	case c.PredictTTL < 0 || c.TokenizeTimeout < 0:
		return fmt.Errorf("kv: predict_ttl and tokenize_timeout must not be negative")
	case c.TokenizeConcurrency < 0 || c.TokenizeCache < 0:
		return fmt.Errorf("kv: tokenize_concurrency and tokenize_cache must be positive")
	case c.Canary != nil && c.Canary.Model == "":
		return fmt.Errorf("kv: canary.model is required")
	case c.Canary != nil && (c.Canary.Interval < 0 || c.Canary.Blocks < 0):
		return fmt.Errorf("kv: canary interval and blocks must be positive")
	}
	seen := map[string]bool{}
	for i, e := range c.Engines {
		if e.Upstream == "" || e.Events == "" {
			return fmt.Errorf("kv: engines[%d]: upstream and events are required", i)
		}
		if seen[e.Upstream] {
			return fmt.Errorf("kv: engines[%d]: upstream %s listed twice", i, e.Upstream)
		}
		seen[e.Upstream] = true
		if e.Ranks < 0 || e.Ranks > kvindex.MaxReplicas {
			return fmt.Errorf("kv: engines[%d]: ranks must be in [1,%d]", i, kvindex.MaxReplicas)
		}
		if _, err := e.endpoints(""); err != nil {
			return fmt.Errorf("kv: engines[%d]: %w", i, err)
		}
	}
	return nil
}

// endpoints returns the engine's feeds, one per rank, keyed like the
// policy's replicas: the dial address, plus "#rank" when it has several.
func (e KVEngine) endpoints(topic string) ([]kvindex.Endpoint, error) {
	ranks := max(e.Ranks, 1)
	var eps []kvindex.Endpoint
	for r := range ranks {
		ep, err := kvindex.RankEndpoint(e.Upstream, e.Events, e.Replay, topic, r)
		if err != nil {
			return nil, err
		}
		if ranks == 1 {
			ep.Replica = e.Upstream
		}
		eps = append(eps, ep)
	}
	return eps, nil
}

// unmarshalKVOption parses the kv options of the policy's Caddyfile block:
//
//	kv_events <upstream> <events> [<replay>] [{
//		ranks <n>
//	}]
//	kv_topic        <topic>
//	kv_block_size   <tokens>
//	kv_max_entries  <n>
//	kv_predict_ttl  <duration>
//	kv_canary <model> [{
//		interval <duration>
//		blocks   <n>
//	}]
//	tokenize [{
//		timeout        <duration>
//		max_concurrent <n>
//		cache_entries  <n>
//		url            <base url>
//	}]
//
// kv_events may appear once per engine; it turns the precise index on.
func (s *RamjetSelection) unmarshalKVOption(d *caddyfile.Dispenser, opt string) (bool, error) {
	if !strings.HasPrefix(opt, "kv_") && opt != "tokenize" {
		return false, nil
	}
	if s.KV == nil {
		s.KV = new(KVConfig)
	}
	kv := s.KV
	var err error
	switch opt {
	case "kv_events":
		var e KVEngine
		args := d.RemainingArgs()
		if len(args) < 2 || len(args) > 3 {
			return true, d.Errf("kv_events: want <upstream> <events> [<replay>]")
		}
		e.Upstream, e.Events = args[0], args[1]
		if len(args) == 3 {
			e.Replay = args[2]
		}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			switch d.Val() {
			case "ranks":
				if e.Ranks != 0 {
					return true, d.Errf("kv_events: ranks specified more than once")
				}
				if e.Ranks, err = intArg(d, "ranks"); err != nil {
					return true, err
				}
				if e.Ranks < 1 {
					return true, d.Errf("kv_events: ranks must be positive")
				}
			default:
				return true, d.Errf("kv_events: unrecognized option '%s'", d.Val())
			}
		}
		for _, o := range kv.Engines {
			if o.Upstream == e.Upstream {
				return true, d.Errf("kv_events %s: specified more than once", e.Upstream)
			}
		}
		kv.Engines = append(kv.Engines, e)
	case "kv_topic":
		kv.Topic, err = stringArg(d, opt)
	case "kv_block_size":
		kv.BlockSize, err = intArg(d, opt)
	case "kv_max_entries":
		kv.MaxEntries, err = intArg(d, opt)
	case "kv_predict_ttl":
		kv.PredictTTL, err = durationArg(d, opt)
	case "kv_canary":
		c := &KVCanary{}
		if !d.Args(&c.Model) || d.NextArg() {
			return true, d.Errf("kv_canary: want <model>")
		}
		seen := map[string]bool{}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			o := d.Val()
			if seen[o] {
				return true, d.Errf("kv_canary: %s specified more than once", o)
			}
			seen[o] = true
			switch o {
			case "interval":
				c.Interval, err = durationArg(d, o)
			case "blocks":
				c.Blocks, err = intArg(d, o)
			default:
				return true, d.Errf("kv_canary: unrecognized option '%s'", o)
			}
			if err != nil {
				return true, err
			}
		}
		kv.Canary = c
	case "tokenize":
		if d.NextArg() {
			return true, d.ArgErr()
		}
		seen := map[string]bool{}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			o := d.Val()
			if seen[o] {
				return true, d.Errf("tokenize: %s specified more than once", o)
			}
			seen[o] = true
			switch o {
			case "timeout":
				kv.TokenizeTimeout, err = durationArg(d, o)
			case "max_concurrent":
				kv.TokenizeConcurrency, err = intArg(d, o)
			case "cache_entries":
				kv.TokenizeCache, err = intArg(d, o)
			case "url":
				kv.TokenizeURL, err = stringArg(d, o)
			default:
				return true, d.Errf("tokenize: unrecognized option '%s'", o)
			}
			if err != nil {
				return true, err
			}
		}
	default:
		return true, d.Errf("unrecognized ramjet option '%s'", opt)
	}
	return true, err
}

func durationArg(d *caddyfile.Dispenser, opt string) (caddy.Duration, error) {
	v, err := oneArg(d, opt)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("%s: %q is not a duration", opt, v)
	}
	return caddy.Duration(dur), nil
}

// kvStates holds the precise-index state across config reloads, keyed by
// state_key and the kv configuration: a reload with the same feeds keeps
// the index and its subscriptions.
var kvStates = caddy.NewUsagePool()

// kvState is one precise index with its feeds and tokenizer.
type kvState struct {
	key    string
	x      *kvindex.Index
	sub    *kvindex.Subscriber
	tk     *kvindex.Tokenizer
	canary *kvindex.Canary // nil unless configured
	ttl    time.Duration
	url    string

	// decisions made with at least one precise candidate, and requests
	// that fell back to the estimate (no fresh feed, or no tokens).
	precise, approx atomic.Uint64
	tokLatency      *latencyHist

	stateKey string
	fleet    atomic.Pointer[fleet] // for route ids; the last provisioned
}

// Destruct stops the feeds: the last policy using them was cleaned up.
func (k *kvState) Destruct() error {
	kvLive.Lock()
	if kvLive.m[k.stateKey] == k {
		delete(kvLive.m, k.stateKey)
	}
	kvLive.Unlock()
	if k.canary != nil {
		k.canary.Close()
	}
	return k.sub.Close()
}

// kvLive maps each state_key to its kv state provisioned last, for the
// metrics collector.
var kvLive struct {
	sync.Mutex
	m map[string]*kvState
}

func (s *RamjetSelection) provisionKV(ctx caddy.Context) error {
	if s.KV == nil {
		return nil
	}
	s.KV.setDefaults()
	if err := s.KV.validate(); err != nil {
		return err
	}
	if err := registerKVMetrics(ctx); err != nil {
		return fmt.Errorf("kv metrics: %w", err)
	}
	b, _ := json.Marshal(s.KV)
	key := fmt.Sprintf("ramjet-kv/%s/%016x", s.StateKey, xxhash.Sum64(b))
	logger := s.logger.Named("kv")
	v, _, err := kvStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		cfg := s.KV
		var eps []kvindex.Endpoint
		for _, e := range cfg.Engines {
			es, err := e.endpoints(cfg.Topic)
			if err != nil {
				return nil, err
			}
			eps = append(eps, es...)
		}
		k := &kvState{key: key, ttl: time.Duration(cfg.PredictTTL), url: cfg.TokenizeURL,
			tokLatency: newLatencyHist(), stateKey: s.StateKey}
		k.x = kvindex.New(kvindex.Config{BlockSize: cfg.BlockSize, MaxEntries: cfg.MaxEntries})
		sub, err := kvindex.NewSubscriber(k.x, eps, kvindex.SubscriberConfig{Logger: logger})
		if err != nil {
			return nil, err
		}
		k.sub = sub
		k.tk = kvindex.NewTokenizer(kvindex.TokenizerConfig{
			Timeout:       time.Duration(cfg.TokenizeTimeout),
			MaxConcurrent: cfg.TokenizeConcurrency,
			CacheEntries:  cfg.TokenizeCache,
			OnLatency:     k.tokLatency.observe,
		})
		if c := cfg.Canary; c != nil {
			var targets []kvindex.CanaryTarget
			for _, e := range cfg.Engines {
				for rank := range e.Ranks {
					id := e.Upstream
					var hdr http.Header
					if e.Ranks > 1 {
						id = fmt.Sprintf("%s#%d", e.Upstream, rank)
						hdr = http.Header{HeaderRank: {fmt.Sprint(rank)}}
					}
					r, _ := k.x.Lookup(id)
					targets = append(targets, kvindex.CanaryTarget{Replica: r, BaseURL: "http://" + e.Upstream, Header: hdr})
				}
			}
			k.canary, err = kvindex.NewCanary(k.x, targets, kvindex.CanaryConfig{
				Model: c.Model, Interval: time.Duration(c.Interval), Blocks: c.Blocks})
			if err != nil {
				return nil, err
			}
		}
		// The feeds outlive this config (a reload keeps them): they stop in
		// Destruct, not with the provisioning context.
		sub.Start(context.Background())
		if k.canary != nil {
			k.canary.Start(context.Background())
		}
		return k, nil
	})
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	s.kv, s.kvKey = v.(*kvState), key
	s.kv.fleet.Store(s.fleet)
	kvLive.Lock()
	if kvLive.m == nil {
		kvLive.m = make(map[string]*kvState)
	}
	kvLive.m[s.StateKey] = s.kv
	kvLive.Unlock()
	return nil
}

func (s *RamjetSelection) cleanupKV() error {
	if s.kv == nil {
		return nil
	}
	s.kv = nil
	_, err := kvStates.Delete(s.kvKey)
	return err
}

// kvView maps a pool view's candidates to kvindex replicas.
type kvView struct {
	view *poolView
	reps []kvindex.Replica
}

func (s *RamjetSelection) kvReplicas(v *poolView) []kvindex.Replica {
	if kv := s.kvv.Load(); kv != nil && kv.view == v {
		return kv.reps
	}
	reps := make([]kvindex.Replica, len(v.keys))
	for i, key := range v.keys {
		reps[i] = -1
		if r, ok := s.kv.x.Lookup(key); ok {
			reps[i] = r
			continue
		}
		// A feed configured for this address under another rank count
		// never reaches the candidate: say so once per pool change.
		for _, e := range s.KV.Engines {
			if e.Upstream == v.pool[i].Dial {
				s.logger.Warn("kv feed does not match the upstream list: check kv_events ranks against how often the address is listed",
					zap.String("replica", key), zap.Int("ranks", e.Ranks))
				break
			}
		}
	}
	s.kvv.Store(&kvView{view: v, reps: reps})
	return reps
}

// kvScratch is the pooled working memory of the precise path.
type kvScratch struct {
	keys    []uint64
	overlap []int
}

var kvScratchPool = sync.Pool{New: func() any { return new(kvScratch) }}

// kvPrompt is what /tokenize needs from a request body.
type kvPrompt struct {
	Model    string          `json:"model"`
	Messages json.RawMessage `json:"messages"`
	Tools    json.RawMessage `json:"tools"`
	Prompt   json.RawMessage `json:"prompt"`
}

// kvQuery is what the precise path needs from a request.
type kvQuery struct {
	ctx  context.Context
	body []byte
	ep   selection.Endpoint
}

// annotateKV sets the exact overlap on the candidates whose replica has a
// healthy feed. It returns the scratch holding the request's block keys
// (for predictKV), or nil when the request is routed by the estimate.
func (s *RamjetSelection) annotateKV(q *kvQuery, pool reverseproxy.UpstreamPool, v *poolView,
	cands []selection.Candidate) *kvScratch {
	body, ep := q.body, q.ep
	k := s.kv
	reps := s.kvReplicas(v)
	base := k.url
	fresh := false
	for i, c := range cands {
		if c.Usable && reps[i] >= 0 && k.x.Fresh(reps[i]) {
			fresh = true
			if base == "" {
				base = "http://" + pool[i].Dial
			}
			break
		}
	}
	if !fresh || (ep != selection.EndpointChat && ep != selection.EndpointCompletions) {
		k.approx.Add(1)
		return nil
	}
	// The cache is keyed by the whole body: identical bodies (retries,
	// repeated prompts) skip both the parse and the preflight; bodies that
	// differ only outside the prompt merely miss.
	key := xxhash.Sum64(body)
	toks, ok := k.tk.Cached(key)
	if !ok {
		var p kvPrompt
		if err := json.Unmarshal(body, &p); err != nil {
			k.approx.Add(1)
			return nil
		}
		req := kvindex.TokenizeRequest{Model: p.Model, Prompt: p.Prompt}
		if ep == selection.EndpointChat {
			req = kvindex.TokenizeRequest{Model: p.Model, Messages: p.Messages, Tools: p.Tools}
		}
		var err error
		if toks, err = k.tk.Tokenize(q.ctx, base, key, req); err != nil {
			k.approx.Add(1)
			if c := s.logger.Check(zap.DebugLevel, "ramjet tokenize fallback"); c != nil {
				c.Write(zap.Error(err))
			}
			return nil
		}
	}
	sc := kvScratchPool.Get().(*kvScratch)
	sc.keys = k.x.Keys(sc.keys[:0], 0, toks)
	if n := k.x.NumReplicas(); cap(sc.overlap) < n {
		sc.overlap = make([]int, n)
	}
	sc.overlap = sc.overlap[:k.x.NumReplicas()]
	if k.x.Annotate(sc.keys, reps, cands, sc.overlap) == 0 {
		k.approx.Add(1)
		kvScratchPool.Put(sc)
		return nil
	}
	k.precise.Add(1)
	return sc
}

// predictKV records the blocks just routed to the chosen candidate and
// returns the scratch.
func (s *RamjetSelection) predictKV(sc *kvScratch, v *poolView, idx int) {
	if sc == nil {
		return
	}
	if reps := s.kvReplicas(v); idx >= 0 && idx < len(reps) && reps[idx] >= 0 {
		s.kv.x.Predict(reps[idx], sc.keys, s.kv.ttl)
	}
	kvScratchPool.Put(sc)
}

// latencyHist is a fixed-bucket histogram of preflight latencies, read by
// the collector.
type latencyHist struct {
	mu      sync.Mutex
	counts  []uint64
	sum     float64
	samples uint64
}

var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

func newLatencyHist() *latencyHist {
	return &latencyHist{counts: make([]uint64, len(latencyBuckets))}
}

func (h *latencyHist) observe(d time.Duration) {
	sec := d.Seconds()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, b := range latencyBuckets {
		if sec <= b {
			h.counts[i]++
		}
	}
	h.sum += sec
	h.samples++
}

func (h *latencyHist) snapshot() (map[float64]uint64, float64, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[float64]uint64, len(latencyBuckets))
	for i, b := range latencyBuckets {
		m[b] = h.counts[i]
	}
	return m, h.sum, h.samples
}
