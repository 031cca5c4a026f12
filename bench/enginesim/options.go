package enginesim

import (
	"fmt"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// Options configures a simulator. Zero fields take the documented
// defaults.
type Options struct {
	// Addr is the HTTP listen address. Default "127.0.0.1:0" (a random
	// port; see Server.URL).
	Addr string
	// AdminAddr, when set, also serves the /sim/* admin routes on a
	// second listener, which stays up while RefuseConnections closes the
	// main one. Default "" (admin routes only on Addr).
	AdminAddr string
	// Model is the served model name. Default "qwen3-32b".
	Model string
	// ModelRoot is the "root" path /v1/models reports, as vLLM reports the
	// checkpoint path. Default "/models/Qwen/Qwen3-32B".
	ModelRoot string
	// Engine is the engine model of every rank (see bench/engine.Config).
	Engine engine.Config
	// Density is the tokenizer stand-in's bytes of text per token
	// (engine.Tokenizer), fractional allowed: prompts, /tokenize, usage,
	// KV events and generated text all follow it. Default 0: 4, what every
	// simulator did before it existed. Real content is 2.5-3.5 bytes per
	// token for code, JSON and tool output and 4.2-5 for prose.
	Density float64
	// Tokenized, when set, records every chat /tokenize call and tells a
	// chat for the same messages when it was served (TokenizedHeader):
	// one log shared by a run's engines.
	Tokenized *TokenizeLog
	// DP is the number of data-parallel ranks behind the port. Default 1.
	DP int
	// TimeScale is how much faster than real time the engines run: 10
	// means one wall second is ten simulated seconds. Default 1, at most
	// 10000 (simulated time must fit a time.Duration for days).
	TimeScale float64
	// Instant runs every engine step as soon as the previous one ended,
	// ignoring the wall clock, so responses come at once (overhead
	// benchmarks). TimeScale is then unused.
	Instant bool
	// DefaultMaxTokens is the output length when a request gives neither
	// max_tokens nor max_completion_tokens. Default 128.
	DefaultMaxTokens int
	// MaxBodyBytes bounds request bodies (413 past it). Default 16 MiB.
	MaxBodyBytes int64
	// QueueFullStatus is the status when a rank's waiting queue is full
	// (Engine.MaxWaiting): 429 or 503. Default 429.
	QueueFullStatus int
	// KVEvents configures the KV cache event publisher; off unless
	// KVEvents.Endpoint is set.
	KVEvents KVEventsOptions
	// Metrics is the /metrics dialect: MetricsVLLM (default, vllm:*
	// series) or MetricsSGLang (sglang:* series, SGLang's names and
	// labels). The OpenAI surface is the same either way.
	Metrics MetricsFlavor

	// Identity is the initial answer of GET /ramjet/identity (identity.go).
	Identity IdentityOptions
	// Faults are the initial faults (see SetFaults).
	Faults Faults
	// Seed seeds the fault draws (error rate). Default 1.
	Seed uint64
	// OnRequest, when set, is called with every request the simulator
	// receives on its OpenAI routes, before any processing (and before
	// faults), so proxy tests can assert exactly what arrived.
	OnRequest func(Recorded)
}

// MetricsFlavor names the engine whose /metrics series the simulator
// exposes.
type MetricsFlavor string

// The /metrics dialects.
const (
	MetricsVLLM   MetricsFlavor = "vllm"
	MetricsSGLang MetricsFlavor = "sglang"
)

// KVEventsOptions configures the ZMQ publisher of KV cache events.
type KVEventsOptions struct {
	// Endpoint is the PUB socket's bind address, e.g. "tcp://127.0.0.1:5557";
	// rank r binds port+r. With port 0 every rank picks its own port (see
	// Server.KVEndpoints). Empty disables events.
	Endpoint string
	// ReplayEndpoint optionally binds a ROUTER socket answering replay
	// requests, port offset by rank as Endpoint.
	ReplayEndpoint string
	// Topic is the first frame of every message. Default "" (vLLM's).
	Topic string
	// Encoding is KVEncodingArray (default) or KVEncodingMap.
	Encoding KVEncoding
	// HashEncoding is HashUint (default), HashInt or HashBytes.
	HashEncoding HashEncoding
	// ReplayBuffer is how many past batches the replay socket keeps.
	// Default 10000 (vLLM's buffer_steps).
	ReplayBuffer int
	// HWM is the PUB high-water mark in messages. Default 100000 (vLLM's).
	HWM int

	// The conventions of other publishers, off by default (vLLM's):
	// Connect makes the PUB socket connect to Endpoint (a subscriber that
	// binds, llm-d's setup) instead of binding it; ParentZero writes a
	// chain start's parent_block_hash as 0 instead of nil; SeqFromOne
	// numbers messages from 1 instead of 0; ReplayTopic adds the topic
	// frame to replay replies (["", topic, seq, payload]).
	Connect     bool
	ParentZero  bool
	SeqFromOne  bool
	ReplayTopic bool
	// OrphanParents writes every BlockStored's parent_block_hash as a hash
	// no block has, chain starts included: a publisher whose chains a
	// subscriber cannot resolve (issue 17's emulator, whose parent 0 was
	// taken for a real block), so every store is an orphan.
	OrphanParents bool
}

// Faults are injected failures; change them at run time with
// Server.SetFaults or PUT /sim/faults.
type Faults struct {
	// ErrorRate is the share of requests answered with ErrorStatus, in [0,1].
	ErrorRate float64 `json:"error_rate"`
	// ErrorStatus is the status of injected errors. Default 500.
	ErrorStatus int `json:"error_status"`
	// Latency is added before a request reaches the engine.
	Latency time.Duration `json:"latency"`
	// HangBeforeFirstToken makes requests hang without a byte of response
	// until the client gives up or the server closes.
	HangBeforeFirstToken bool `json:"hang_before_first_token"`
	// DieAfterTokens, when positive, drops the connection once that many
	// tokens were generated (mid-stream for streams; no response at all
	// otherwise).
	DieAfterTokens int `json:"die_after_tokens"`
	// StallAfterTokens, when positive, stops sending once that many
	// tokens were generated, holding the connection open and silent until
	// the client gives up or the server closes (a hung engine mid-stream;
	// no response at all for a non-streaming request).
	StallAfterTokens int `json:"stall_after_tokens"`
	// RefuseConnections closes the listener (connections are refused)
	// until it is cleared. The port stays bound meanwhile (on unix), so
	// that no other process's listener is handed it.
	RefuseConnections bool `json:"refuse_connections"`
	// SpecAcceptance, when set, replaces the engines' speculative
	// acceptance rate (e.g. 0.02 for a collapsed drafter); the
	// spec-decode counters and the timing follow.
	SpecAcceptance *float64 `json:"spec_acceptance,omitempty"`
}

func (o *Options) setDefaults() {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.Model == "" {
		o.Model = "qwen3-32b"
	}
	if o.ModelRoot == "" {
		o.ModelRoot = "/models/Qwen/Qwen3-32B"
	}
	if o.DP == 0 {
		o.DP = 1
	}
	if o.TimeScale == 0 {
		o.TimeScale = 1
	}
	if o.DefaultMaxTokens == 0 {
		o.DefaultMaxTokens = 128
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 16 << 20
	}
	if o.Metrics == "" {
		o.Metrics = MetricsVLLM
	}
	if o.QueueFullStatus == 0 {
		o.QueueFullStatus = 429
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	k := &o.KVEvents
	if k.Encoding == "" {
		k.Encoding = KVEncodingArray
	}
	if k.HashEncoding == "" {
		k.HashEncoding = HashUint
	}
	if k.ReplayBuffer == 0 {
		k.ReplayBuffer = 10000
	}
	if k.HWM == 0 {
		k.HWM = 100000
	}
	o.Engine.SetDefaults()
}

func (o *Options) validate() error {
	switch {
	case o.DP < 1 || o.DP > 64:
		return fmt.Errorf("DP must be in [1,64]")
	case o.TimeScale <= 0 || o.TimeScale > 10000:
		return fmt.Errorf("TimeScale must be in (0,10000]; use Instant for more")
	case o.DefaultMaxTokens < 1:
		return fmt.Errorf("DefaultMaxTokens must be positive")
	case o.Metrics != MetricsVLLM && o.Metrics != MetricsSGLang:
		return fmt.Errorf("metrics dialect must be %q or %q", MetricsVLLM, MetricsSGLang)
	case o.QueueFullStatus != 429 && o.QueueFullStatus != 503:
		return fmt.Errorf("QueueFullStatus must be 429 or 503")
	case o.KVEvents.Encoding != KVEncodingArray && o.KVEvents.Encoding != KVEncodingMap:
		return fmt.Errorf("KVEvents.Encoding must be %q or %q", KVEncodingArray, KVEncodingMap)
	case o.KVEvents.HashEncoding != HashUint && o.KVEvents.HashEncoding != HashInt && o.KVEvents.HashEncoding != HashBytes:
		return fmt.Errorf("KVEvents.HashEncoding must be uint, int or bytes")
	case o.KVEvents.ReplayBuffer < 0 || o.KVEvents.HWM < 0:
		return fmt.Errorf("KVEvents.ReplayBuffer and HWM must not be negative")
	}
	if err := (engine.Tokenizer{Density: o.Density}).Validate(); err != nil {
		return err
	}
	if err := o.Engine.Validate(); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return o.Faults.validate()
}

func (f Faults) validate() error {
	switch {
	case f.ErrorRate < 0 || f.ErrorRate > 1:
		return fmt.Errorf("error_rate must be in [0,1]")
	case f.ErrorStatus != 0 && (f.ErrorStatus < 400 || f.ErrorStatus > 599):
		return fmt.Errorf("error_status must be a 4xx or 5xx status")
	case f.Latency < 0:
		return fmt.Errorf("latency must not be negative")
	case f.DieAfterTokens < 0:
		return fmt.Errorf("die_after_tokens must not be negative")
	case f.StallAfterTokens < 0:
		return fmt.Errorf("stall_after_tokens must not be negative")
	case f.SpecAcceptance != nil && (*f.SpecAcceptance < 0 || *f.SpecAcceptance > 1):
		return fmt.Errorf("spec_acceptance must be in [0,1]")
	}
	return nil
}
