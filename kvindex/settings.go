package kvindex

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/duration"
)

// Settings is the JSON configuration of the precise path (the ramjet
// policy's "kv"; module.RamjetSelection.KV), off unless set: the engines' own KV-cache events say which replica holds which
// blocks, a /tokenize preflight turns each request into token ids, and the
// exact overlap replaces the estimate for every replica whose event feed is
// healthy. Replicas without a healthy feed, and requests the preflight
// cannot tokenize in time, are routed by the estimate as before.
//
// The preflight runs in the ramjet handler (module: ramjet_observe, ahead
// of reverse_proxy, with the policy's state_key), before selection:
// without the handler in the chain every decision uses the estimate.
type Settings struct {
	// Engines lists the event feeds, one entry per engine, and at most
	// one template (upstream "*", template.go) for every upstream
	// without an entry of its own.
	Engines []FeedSpec `json:"engines,omitempty"`

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
	PredictTTL duration.Duration `json:"predict_ttl,omitempty"`

	// TokenizeTimeout bounds the /tokenize preflight of one request; past
	// it the request is routed by the estimate. Default: 100ms.
	TokenizeTimeout duration.Duration `json:"tokenize_timeout,omitempty"`

	// TokenizeConcurrency bounds the preflights in flight; past it
	// requests are routed by the estimate at once. Default: 64.
	TokenizeConcurrency int `json:"tokenize_concurrency,omitempty"`

	// TokenizeCache bounds the cached tokenizations. Default: 4096.
	TokenizeCache int `json:"tokenize_cache,omitempty"`

	// TokenizeWait is when a request waits for its preflight: "auto"
	// (the default, "" too) only while the exact overlaps may decide
	// otherwise than the estimate (an engine dropped blocks within the
	// last minute, or other instances seen: the wait rule, diverge.go),
	// else it is routed by the estimate at once and tokenized in the
	// background; "always": every request without a cached message prefix
	// waits, and every chat with one is routed on its tokens (the default
	// until 2026-12-07); "warm": auto, and a lone instance waits only
	// for a request whose prompt the estimate credits to some replica
	// (Precise.WaitFor).
	TokenizeWait string `json:"tokenize_wait,omitempty"`

	// TokenizeURL is the base URL of the /tokenize endpoint, e.g.
	// "http://10.0.0.5:8000". Default: the scheme and dial address of an
	// engine whose feed is healthy, in turn.
	TokenizeURL string `json:"tokenize_url,omitempty"`

	// QueueEstimate is the queue rule (PreciseConfig.QueueEstimate): an
	// exact overlap below the estimate's credit is left to the estimate
	// while the replica's pending prefill is at least QueueEstimate times
	// its KV capacity (the capacity known: scraped or kv_capacity). 0 is
	// the default (1: a whole cache's worth queued), -1 off (every exact
	// overlap decides, the rule before 2026-12-07).
	QueueEstimate float64 `json:"queue_estimate,omitempty"`

	// CapLoad bounds the estimate cap by the replica's load
	// (PreciseConfig.CapLoad): an exact overlap past the estimate's credit
	// on blocks this router routed there stands while the replica's
	// in-flight requests and this one, each as long as this prompt, fit in
	// CapLoad times its KV capacity (the capacity known). 0: the default,
	// 3 (DefaultCapLoad), with cap_peer, cap_gain and cap_fit the lift
	// stack of bench/EXPERIMENTS.md 114 and 118; -1: off, the estimate cap
	// everywhere (the rule before 2026-12-07; bench/EXPERIMENTS.md 104).
	CapLoad float64 `json:"cap_load,omitempty"`

	// CapPeer, with CapLoad, lifts the estimate cap only on a replica no
	// busier than its peers (PreciseConfig.CapPeer): its resident context
	// (the contexts of the requests in flight there) at most CapPeer times
	// the mean over the request's candidates. 0: the default, 1.1
	// (DefaultCapPeer); -1: off, CapLoad alone decides (bench/EXPERIMENTS.md
	// 107).
	CapPeer float64 `json:"cap_peer,omitempty"`

	// CapForeignQueue leaves to the estimate also an exact overlap past
	// its credit on blocks this router did not route there, on a replica
	// whose pending prefill is at least CapForeignQueue times its KV
	// capacity (PreciseConfig.CapForeignQueue). 0: the default, 4
	// (DefaultCapForeignQueue); -1: off, the rule before 2026-12-07
	// (bench/EXPERIMENTS.md 110).
	CapForeignQueue float64 `json:"cap_foreign_queue,omitempty"`
	// CapGain, with CapLoad, lifts the estimate cap only where the lift
	// saves more prefill than the queue it keeps the request behind
	// (PreciseConfig.CapGain): the replica's pending prefill less the
	// least of the other candidates' below CapGain times the tokens its
	// exact overlap credits past the estimate's. 0: the default, 0.75
	// (DefaultCapGain) scaled as cap_gain_fleet, whether set or not; -1:
	// off; a positive value is scaled only with cap_gain_fleet
	// (bench/EXPERIMENTS.md 111).
	CapGain float64 `json:"cap_gain,omitempty"`

	// CapGainFleet scales cap_gain by how saturated the request's
	// candidates are: their resident context over their KV capacity
	// (PreciseConfig.CapGainFleet): implied by the default cap_gain (0),
	// off by default with a cap_gain given (bench/EXPERIMENTS.md 111).
	CapGainFleet bool `json:"cap_gain_fleet,omitempty"`

	// CapFit, with CapLoad, lifts the estimate cap only on a replica whose
	// KV capacity holds CapFit times the request's prompt
	// (PreciseConfig.CapFit): a cache the prompt mostly fills keeps none
	// of the conversations the lift spares elsewhere. 0: the default, 2.5
	// (DefaultCapFit); -1: off (bench/EXPERIMENTS.md 114).
	CapFit float64 `json:"cap_fit,omitempty"`

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
	Canary *CanarySettings `json:"canary,omitempty"`
}

// CanarySettings configures the exact-placement canaries.
type CanarySettings struct {
	// Model is the model name the probes ask for. Required.
	Model string `json:"model" caddyfile:"arg"`
	// Interval is the time between two probes. Default: 30s.
	Interval duration.Duration `json:"interval,omitempty"`
	// Blocks is the probe prompt's length in blocks. Default: 4.
	Blocks int `json:"blocks,omitempty"`
}

// SetDefaults fills the zero values.
func (c *Settings) SetDefaults() {
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.MaxEntries == 0 {
		c.MaxEntries = 1 << 20
	}
	if c.PredictTTL == 0 {
		c.PredictTTL = duration.Duration(DefaultPredictTTL)
	}
	if c.TokenizeTimeout == 0 {
		c.TokenizeTimeout = duration.Duration(100 * time.Millisecond)
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

// Validate rejects unusable settings, naming the field.
func (c *Settings) Validate() error {
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
	case c.QueueEstimate < 0 && c.QueueEstimate != -1:
		return fmt.Errorf("kv: queue_estimate must be positive, 0 (the default) or -1 (off), got %v", c.QueueEstimate)
	case c.CapLoad < 0 && c.CapLoad != -1:
		return fmt.Errorf("kv: cap_load must be positive, 0 (the default) or -1 (off), got %v", c.CapLoad)
	case c.CapPeer < 0 && c.CapPeer != -1:
		return fmt.Errorf("kv: cap_peer must be positive, 0 (the default) or -1 (off), got %v", c.CapPeer)
	case c.CapForeignQueue < 0 && c.CapForeignQueue != -1:
		return fmt.Errorf("kv: cap_foreign_queue must be positive, 0 (the default) or -1 (off), got %v", c.CapForeignQueue)
	case c.CapGain < 0 && c.CapGain != -1:
		return fmt.Errorf("kv: cap_gain must be positive, 0 (the default) or -1 (off), got %v", c.CapGain)
	case c.CapFit < 0 && c.CapFit != -1:
		return fmt.Errorf("kv: cap_fit must be positive, 0 (the default) or -1 (off), got %v", c.CapFit)
	case c.TokenizeWait != "" && c.TokenizeWait != "auto" && c.TokenizeWait != "always" && c.TokenizeWait != "warm":
		return fmt.Errorf("kv: tokenize_wait must be auto, always or warm, got %q", c.TokenizeWait)
	case c.Canary != nil && c.Canary.Model == "":
		return fmt.Errorf("kv: canary.model is required")
	case c.Canary != nil && (c.Canary.Interval < 0 || c.Canary.Blocks < 0):
		return fmt.Errorf("kv: canary interval and blocks must be positive")
	}
	if err := ValidateFeeds(c.Engines); err != nil {
		return fmt.Errorf("kv: %w", err)
	}
	return nil
}

// Precise is the Precise configuration of c: token is the resolved
// upstream_token, rankHeader the data-parallel rank header, latency
// observes each tokenize preflight.
func (c *Settings) Precise(token, rankHeader string, logger *zap.Logger, latency func(time.Duration)) (PreciseConfig, error) {
	pc := PreciseConfig{
		Index:       Config{BlockSize: c.BlockSize, MaxEntries: c.MaxEntries},
		Token:       token,
		PredictTTL:  time.Duration(c.PredictTTL),
		TokenizeURL: c.TokenizeURL,
		Tokenizer: TokenizerConfig{
			Timeout:       time.Duration(c.TokenizeTimeout),
			MaxConcurrent: c.TokenizeConcurrency,
			CacheEntries:  c.TokenizeCache,
			OnLatency:     latency,
		},
		Subscriber: SubscriberConfig{Logger: logger},
		Logger:     logger,
		WaitAuto:   c.TokenizeWait != "always",
		WaitWarm:   c.TokenizeWait == "warm",

		QueueEstimate: c.QueueEstimate,
		CapLoad:       c.CapLoad,
		CapPeer:       c.CapPeer,

		CapForeignQueue: c.CapForeignQueue,
		CapGain:         c.CapGain,
		CapGainFleet:    c.CapGainFleet,
		CapFit:          c.CapFit,
	}
	if cc := c.Canary; cc != nil {
		pc.Canary = CanaryConfig{Model: cc.Model, Interval: time.Duration(cc.Interval), Blocks: cc.Blocks}
	}
	for i := range c.Engines {
		if c.Engines[i].IsTemplate() {
			pc.Template = &TemplateConfig{Feed: c.Engines[i], Topic: c.Topic, RankHeader: rankHeader}
		}
	}
	var err error
	pc.Engines, err = PreciseEngines(c.Engines, c.Topic, rankHeader)
	return pc, err
}
