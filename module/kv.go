package module

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
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
//
// The preflight runs in the ramjet handler (ramjet_observe, ahead of
// reverse_proxy, with the policy's state_key), before selection: without
// the handler in the chain every decision uses the estimate.
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

	// PredictTTL bounds how long a block just routed to a replica counts
	// as held there: a prediction lives until the engine's event confirms
	// it, or until 2s after its request ended, and at most this long.
	// Default: 5m (longer than any queue and prefill).
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
	// "http://10.0.0.5:8000". Default: the scheme and dial address of an
	// engine whose feed is healthy, in turn.
	TokenizeURL string `json:"tokenize_url,omitempty"`

	// UpstreamToken is the bearer token sent to the engines with every
	// tokenize preflight and canary probe ("Authorization: Bearer
	// <token>"), as the guard sends it with proxied requests.
	// Placeholders such as {env.RJ_UPSTREAM_TOKEN} are resolved. Default:
	// none.
	UpstreamToken string `json:"upstream_token,omitempty"`

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
	// Scheme is how the engine's HTTP API is reached for the tokenize
	// preflight and the canary: "http" or "https" (as the reverse_proxy
	// transport reaches it). Default: "http".
	Scheme string `json:"scheme,omitempty"`
	// Bind makes Events an address ramjet binds and the engine's PUB
	// socket connects to (vLLM "endpoint": "tcp://<ramjet>:5557", llm-d's
	// usual setup), instead of the engine's address ramjet dials (vLLM's
	// default "tcp://*:5557"). Engines may share one bound address when
	// each has its own Topic. Rank r binds the port plus r. Default: dial.
	Bind bool `json:"bind,omitempty"`
	// Topic is this engine's topic (vLLM "topic"), overriding the policy's
	// kv_topic; required to tell apart engines sharing a bound address,
	// e.g. "kv@10.0.0.5:8000@<model>".
	Topic string `json:"topic,omitempty"`
}

func (c *KVConfig) setDefaults() {
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 1 << 20
	}
	if c.PredictTTL == 0 {
		c.PredictTTL = caddy.Duration(kvindex.DefaultPredictTTL)
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
		if e.Scheme != "" && e.Scheme != "http" && e.Scheme != "https" {
			return fmt.Errorf("kv: engines[%d]: scheme must be http or https, got %q", i, e.Scheme)
		}
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
	if e.Topic != "" {
		topic = e.Topic
	}
	var eps []kvindex.Endpoint
	for r := range ranks {
		ep, err := kvindex.RankEndpoint(e.Upstream, e.Events, e.Replay, topic, r)
		if err != nil {
			return nil, err
		}
		if ranks == 1 {
			ep.Replica = e.Upstream
		}
		ep.Bind = e.Bind
		eps = append(eps, ep)
	}
	return eps, nil
}

// unmarshalKVOption parses the kv options of the policy's Caddyfile block:
//
//	kv_events <upstream> [dial|bind] <events> [<replay>] [{
//		ranks  <n>
//		scheme http|https
//		topic  <topic>
//	}]
//	kv_upstream_token <token>
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
// "dial" (the default) connects to the engine's PUB socket; "bind" listens
// on <events> for the engine's PUB socket to connect to.
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
		if len(args) >= 2 && (args[1] == "bind" || args[1] == "dial") {
			e.Bind = args[1] == "bind"
			args = append(args[:1], args[2:]...)
		}
		if len(args) < 2 || len(args) > 3 {
			return true, d.Errf("kv_events: want <upstream> [dial|bind] <events> [<replay>]")
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
			case "scheme":
				if e.Scheme != "" {
					return true, d.Errf("kv_events: scheme specified more than once")
				}
				if e.Scheme, err = stringArg(d, "scheme"); err != nil {
					return true, err
				}
				if e.Scheme != "http" && e.Scheme != "https" {
					return true, d.Errf("kv_events: scheme must be http or https")
				}
			case "topic":
				if e.Topic != "" {
					return true, d.Errf("kv_events: topic specified more than once")
				}
				if e.Topic, err = stringArg(d, "topic"); err != nil {
					return true, err
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
	case "kv_upstream_token":
		kv.UpstreamToken, err = stringArg(d, opt)
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

// kvState is one precise-path service (kvindex.Precise) kept across
// reloads, with what the module adds: the preflight's latency histogram
// and the fleet whose route ids label its metrics.
type kvState struct {
	key    string
	p      *kvindex.Precise
	x      *kvindex.Index     // p's index
	tk     *kvindex.Tokenizer // p's tokenizer
	canary *kvindex.Canary    // p's canary; nil unless configured

	// timeout bounds the whole preflight of one request (waiting for an
	// identical one in flight included).
	timeout    time.Duration
	tokLatency *latencyHist

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
	return k.p.Close()
}

// kvLive maps each state_key to its kv state provisioned last, for the
// metrics collector.
var kvLive struct {
	sync.Mutex
	m map[string]*kvState
}

// preciseConfig is the kvindex.Precise configuration of c.
func (c *KVConfig) preciseConfig(logger *zap.Logger, latency func(time.Duration)) (kvindex.PreciseConfig, error) {
	pc := kvindex.PreciseConfig{
		Index:       kvindex.Config{BlockSize: c.BlockSize, MaxEntries: c.MaxEntries},
		Token:       resolveSecret(c.UpstreamToken),
		PredictTTL:  time.Duration(c.PredictTTL),
		TokenizeURL: c.TokenizeURL,
		Tokenizer: kvindex.TokenizerConfig{
			Timeout:       time.Duration(c.TokenizeTimeout),
			MaxConcurrent: c.TokenizeConcurrency,
			CacheEntries:  c.TokenizeCache,
			OnLatency:     latency,
		},
		Subscriber: kvindex.SubscriberConfig{Logger: logger},
		Logger:     logger,
	}
	if cc := c.Canary; cc != nil {
		pc.Canary = kvindex.CanaryConfig{Model: cc.Model, Interval: time.Duration(cc.Interval), Blocks: cc.Blocks}
	}
	for _, e := range c.Engines {
		eps, err := e.endpoints(c.Topic)
		if err != nil {
			return pc, err
		}
		scheme := e.Scheme
		if scheme == "" {
			scheme = "http"
		}
		for rank, ep := range eps {
			var hdr http.Header
			if len(eps) > 1 {
				hdr = http.Header{HeaderRank: {strconv.Itoa(rank)}}
			}
			pc.Engines = append(pc.Engines, kvindex.PreciseEngine{Feed: ep,
				BaseURL: scheme + "://" + e.Upstream, Header: hdr})
		}
	}
	return pc, nil
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
		k := &kvState{key: key, timeout: time.Duration(s.KV.TokenizeTimeout),
			tokLatency: newLatencyHist(), stateKey: s.StateKey}
		pc, err := s.KV.preciseConfig(logger, k.tokLatency.observe)
		if err != nil {
			return nil, err
		}
		if k.p, err = kvindex.NewPrecise(pc); err != nil {
			return nil, err
		}
		k.x, k.tk, k.canary = k.p.Index(), k.p.Tokenizer(), k.p.Canary()
		// The feeds outlive this config (a reload keeps them): they stop in
		// Destruct, not with the provisioning context.
		k.p.Start(context.Background())
		return k, nil
	})
	if err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	s.kv, s.kvKey = v.(*kvState), key
	s.kv.fleet.Store(s.fleet)
	s.fleet.kv.Store(&kvPreflight{kv: s.kv, maxBody: s.MaxBodyBytes, owner: s})
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
	if pf := s.fleet.kv.Load(); pf != nil && pf.owner == s {
		s.fleet.kv.CompareAndSwap(pf, nil)
	}
	s.kv = nil
	_, err := kvStates.Delete(s.kvKey)
	return err
}

// bindKV maps the slots of a new pool view to the precise index's feeds,
// warning once per pool change about a feed configured for an address
// under another rank count (it never reaches the candidate).
func (s *RamjetSelection) bindKV(v *poolView) {
	if s.kv == nil {
		return
	}
	for i, key := range v.keys {
		if s.kv.p.Bind(v.slots[i], key) {
			continue
		}
		for _, e := range s.KV.Engines {
			if e.Upstream == v.pool[i].Dial {
				s.logger.Warn("kv feed does not match the upstream list: check kv_events ranks against how often the address is listed",
					zap.String("replica", key), zap.Int("ranks", e.Ranks))
				break
			}
		}
	}
}

// kvPreflight is what the ramjet handler needs to run the tokenize
// preflight of a fleet's precise path before selection: the service and
// the policy's body bound. It is published on the fleet by the policy
// that provisioned it last.
type kvPreflight struct {
	kv      *kvState
	maxBody int64
	owner   *RamjetSelection
}

// preflight tokenizes r's prompt for the precise path and keeps the token
// ids in st for Select. It runs in the ramjet handler, ahead of
// reverse_proxy, bounded by the tokenize timeout and concurrency; on any
// failure the request is routed by the estimate.
func (pf *kvPreflight) preflight(r *http.Request, st *reqState, x selection.Extractor, logger *zap.Logger) {
	if r.Method != http.MethodPost {
		return
	}
	ep := selection.EndpointForPath(r.URL.Path)
	if ep != selection.EndpointChat && ep != selection.EndpointCompletions {
		return
	}
	k := pf.kv
	if !k.p.Ready() {
		return // no fresh feed: the exact overlap would not be used
	}
	st.readBody(r, pf.maxBody)
	b := st.acquireBody()
	if b == nil {
		return
	}
	defer b.release()
	f := st.features(x, ep) // cached for Select: one parse per request
	if f == nil {
		return
	}
	// The cache is keyed by the whole body: identical bodies (retries,
	// repeated prompts) skip both the request build and the preflight;
	// bodies that differ only outside the prompt merely miss.
	key := xxhash.Sum64(b.buf)
	toks, ok := k.tk.Cached(key)
	var late *kvindex.Late
	if !ok {
		req, err := tokenizeRequest(ep, b.buf, f)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), k.timeout)
		toks, late, err = k.p.Preflight(ctx, key, req, st.routedSlot)
		cancel()
		if err != nil {
			if c := logger.Check(zap.DebugLevel, "ramjet tokenize fallback"); c != nil {
				c.Write(zap.Error(err))
			}
		}
	}
	st.route.tokens = toks
	if toks != nil || late != nil {
		st.route.kv = &kvRequest{p: k.p, st: st, late: late}
	}
}

// tokenizeRequest builds the /tokenize request of a body from its one
// parse: the decoded model and the raw messages and tools (chat) or prompt
// (completions), sliced out of the body by the spans selection.Parse
// recorded. Nothing is parsed again.
func tokenizeRequest(ep selection.Endpoint, body []byte, f *selection.Features) (kvindex.TokenizeRequest, error) {
	if f == nil {
		return kvindex.TokenizeRequest{}, errors.New("tokenize request: body not parsed")
	}
	req := kvindex.TokenizeRequest{Model: string(f.Model)}
	if ep == selection.EndpointChat {
		req.Messages, req.Tools = f.Messages.Bytes(body), f.Tools.Bytes(body)
		if req.Messages == nil {
			return kvindex.TokenizeRequest{}, errors.New("tokenize request: no messages")
		}
		return req, nil
	}
	req.Prompt = f.Prompt.Bytes(body)
	if req.Prompt == nil {
		return kvindex.TokenizeRequest{}, errors.New("tokenize request: no prompt")
	}
	return req, nil
}

// latencyHist is a fixed-bucket histogram of preflight latencies, read by
// the collector.
type latencyHist struct {
	mu      sync.Mutex
	counts  []uint64
	sum     float64
	samples uint64
}

var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .075, .1, .15, .2, .25, .5, 1, 2}

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

// kvDirectiveOptions are the precise path's options of the ramjet
// directive, each one line so that an environment variable can carry it:
//
//	kv_events    <upstream>=<tcp://events> ...   dial each engine's PUB socket
//	kv_replay    <upstream>=<tcp://replay> ...   each engine's replay ROUTER socket
//	kv_bind      <tcp://addr>                    or bind one SUB for every engine
//	kv_topics    <upstream>=<topic> ...          each engine's topic (required with
//	                                             kv_bind for more than one engine)
//	kv_topic     <topic>                         the topic of every engine otherwise
//	kv_block_size <tokens>                       the engines' KV block size
//	tokenize_timeout <duration>                  the /tokenize preflight's timeout
//
// Lists are space- or comma-separated; an empty value (an unset
// environment variable) keeps the default, and without kv_events or
// kv_bind the precise path stays off. dp_ranks and the upstream's scheme
// apply to the feeds too.
var kvDirectiveOptions = map[string]bool{"kv_events": true, "kv_replay": true, "kv_bind": true,
	"kv_topics": true, "kv_topic": true, "kv_block_size": true, "tokenize_timeout": true}

// kvDirective is the parsed precise-path options of the ramjet directive.
type kvDirective struct {
	events, replay, topics map[string]string // upstream -> value
	bind, topic            string
	blockSize              int
	tokenizeTimeout        caddy.Duration
}

// parse reads one of kvDirectiveOptions.
func (k *kvDirective) parse(d *caddyfile.Dispenser, name string, args []string) error {
	args = splitList(args)
	pairs := func() (map[string]string, error) {
		m := map[string]string{}
		for _, a := range args {
			up, v, ok := strings.Cut(a, "=")
			if !ok || up == "" || v == "" {
				return nil, d.Errf("%s: want <upstream>=<value>, got %q", name, a)
			}
			if _, dup := m[up]; dup {
				return nil, d.Errf("%s: upstream %s listed twice", name, up)
			}
			m[up] = v
		}
		return m, nil
	}
	one := func() (string, error) {
		if len(args) > 1 {
			return "", d.Errf("%s: want one value, got %d", name, len(args))
		}
		if len(args) == 0 {
			return "", nil
		}
		return args[0], nil
	}
	var err error
	switch name {
	case "kv_events":
		k.events, err = pairs()
	case "kv_replay":
		k.replay, err = pairs()
	case "kv_topics":
		k.topics, err = pairs()
	case "kv_bind":
		k.bind, err = one()
	case "kv_topic":
		k.topic, err = one()
	case "kv_block_size":
		var v string
		if v, err = one(); err == nil && v != "" {
			if k.blockSize, err = strconv.Atoi(v); err != nil || k.blockSize <= 0 {
				err = d.Errf("kv_block_size must be a positive integer, got %q", v)
			}
		}
	case "tokenize_timeout":
		var v string
		if v, err = one(); err == nil && v != "" {
			dur, perr := caddy.ParseDuration(v)
			k.tokenizeTimeout = caddy.Duration(dur)
			if perr != nil || dur <= 0 {
				err = d.Errf("tokenize_timeout must be a positive duration, got %q", v)
			}
		}
	}
	return err
}

// config returns the policy's KVConfig for the upstreams (dial addresses,
// schemes and ranks in upstream order), or nil when the precise path is
// off.
func (k *kvDirective) config(dials, schemes []string, ranks []int) (*KVConfig, error) {
	if len(k.events) == 0 && k.bind == "" {
		if len(k.replay)+len(k.topics) > 0 || k.blockSize != 0 || k.tokenizeTimeout != 0 || k.topic != "" {
			return nil, fmt.Errorf("kv options need kv_events or kv_bind")
		}
		return nil, nil
	}
	if len(k.events) > 0 && k.bind != "" {
		return nil, fmt.Errorf("kv_events (dial) and kv_bind (bind) are exclusive: choose how the engines' PUB sockets connect")
	}
	known := map[string]bool{}
	for _, u := range dials {
		known[u] = true
	}
	for _, m := range []map[string]string{k.events, k.replay, k.topics} {
		for up := range m {
			if !known[up] {
				return nil, fmt.Errorf("kv: %s is not one of the upstreams (write it as in the upstream list, host:port)", up)
			}
		}
	}
	c := &KVConfig{Topic: k.topic, BlockSize: k.blockSize, TokenizeTimeout: k.tokenizeTimeout}
	for i, up := range dials {
		e := KVEngine{Upstream: up, Replay: k.replay[up], Topic: k.topics[up]}
		if ranks[i] > 1 {
			e.Ranks = ranks[i]
		}
		if schemes[i] == "https" {
			e.Scheme = "https"
		}
		if k.bind != "" {
			e.Events, e.Bind = k.bind, true
			if e.Topic == "" && len(dials) > 1 {
				return nil, fmt.Errorf("kv_bind: upstream %s needs its topic in kv_topics (engines sharing a bound socket are told apart by topic)", up)
			}
		} else if e.Events = k.events[up]; e.Events == "" {
			continue // no feed: routed by the estimate
		}
		c.Engines = append(c.Engines, e)
	}
	return c, nil
}
