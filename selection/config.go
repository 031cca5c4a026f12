package selection

import (
	"fmt"
	"math"
)

// MaxReplicas is the number of replicas (dial address plus data-parallel
// rank) one Router tracks at once. Router.Unregister frees a departed
// replica's slot for a new one, so a fleet whose members come and go is
// not limited by the replicas it has seen, only by the ones it has now.
// The approximate index's holder sets are as wide as the highest slot in
// use (one 64-bit word per 64 replicas), not MaxReplicas.
const MaxReplicas = 1024

// Defaults of every knob. They were chosen by the parameter sweep of the
// fleet simulation; see bench/RESULTS.md for the command that reproduces it.
const (
	DefaultAffinityCap      = 65536
	DefaultAlpha            = 1.0
	DefaultRequestCost      = 512
	DefaultBlockTokens      = 64
	DefaultPrefixTokens     = 131072
	DefaultCharsPerToken    = 4.0
	DefaultIndexBudget      = 64 << 20
	DefaultLongOutputTokens = 1024
	DefaultTieEpsilon       = 1.0
	DefaultOutputWeight     = 4.0
	DefaultContextWeight    = 0.0
	DefaultPairWeight       = 12.0
)

// Knobs is a set of the knobs for which zero is a value of its own: alpha 0
// is pure affinity, request_cost 0 counts pending prefill only,
// tie_epsilon 0 ties exact scores only, output_weight 0 turns the output
// bonus off.
type Knobs uint8

// The knobs whose zero is a value.
const (
	KnobAlpha Knobs = 1 << iota
	KnobRequestCost
	KnobTieEpsilon
	KnobOutputWeight
	KnobPairWeight

	// ZeroKnobs is every knob above.
	ZeroKnobs = KnobAlpha | KnobRequestCost | KnobTieEpsilon | KnobOutputWeight | KnobPairWeight
)

// KnobNamed returns the knob with JSON/Caddyfile name name, or 0 when
// zero is not a value of that knob (affinity_cap, block_tokens...).
func KnobNamed(name string) Knobs {
	switch name {
	case "alpha":
		return KnobAlpha
	case "request_cost":
		return KnobRequestCost
	case "tie_epsilon":
		return KnobTieEpsilon
	case "output_weight":
		return KnobOutputWeight
	case "pair_weight":
		return KnobPairWeight
	}
	return 0
}

// Config holds the routing knobs. A zero value means "use the default"
// (see SetDefaults), except for the knobs listed in Explicit, whose value,
// zero included, was given. All token quantities are estimated from prompt
// bytes with CharsPerToken unless an exact overlap is supplied by the
// caller.
type Config struct {
	// AffinityCap is the most warm prefix cache can be worth, in tokens.
	AffinityCap int `json:"affinity_cap,omitempty"`
	// Alpha is how many tokens of warm overlap one token of live load is
	// worth.
	Alpha float64 `json:"alpha,omitempty"`
	// RequestCost is the load, in tokens, that every in-flight request adds
	// to its replica on top of its pending prefill.
	RequestCost int `json:"request_cost,omitempty"`
	// ContextWeight weighs the decode side of the work: the context that a
	// replica's in-flight requests keep resident in KV (their prompt
	// tokens, R) and read at every decode step, in the same token units as
	// overlap, growing with the share of the replica's KV capacity (C,
	// Router.SetCapacity or kv_capacity; 262,144 tokens when unknown) it
	// fills:
	//
	//	load(r) = pending prefill + in-flight x request_cost + context_weight x R x R / C
	//
	// A few short conversations weigh next to nothing; a replica whose
	// running agents fill its KV weighs as much as their context. So a
	// fleet of long-context agents spreads over the replicas that exist
	// rather than piling onto the few that hold their shared prefix.
	// Default 0 (the decode side counts as request_cost only): in the fleet
	// simulation's sweep (bench/EXPERIMENTS.md) every positive weight cost
	// more cached share and TTFT on the other workloads, and at 8 replicas
	// on agent-fleet itself, than it gained on agent-fleet at 64 replicas;
	// 0.25 to 1 suit a fleet of long-context agents with idle replicas.
	ContextWeight float64 `json:"context_weight,omitempty"`
	// PairWeight weighs the decode work a request and a replica's
	// in-flight requests impose on each other (every decode step reads the
	// context of every running sequence; past its KV capacity the engine
	// preempts and recomputes): the request's share of the replica's KV
	// capacity times the context resident there,
	//
	//	load(r) += pair_weight x P x R / max(C, 196,608)
	//
	// (P the request's prompt tokens, R and C as for context_weight, C
	// floored at DefaultPairFloor so that a small cache does not make the
	// same context outweigh a full prefix hit; R
	// also counts the context of requests that ended on the replica until
	// as many tokens of new requests are reserved there, as a closed-loop
	// agent between turns still holds its context and will be back, and
	// while the replica saw a release within the last 20 s,
	// DefaultLingerTTL: context whose owner has not come back by then is
	// presumed done),
	// except on the request's home: the one replica that holds strictly
	// more of its prompt than any other. So a long context is never moved
	// away from the only replica that holds it, while requests that share
	// only a common prefix (the first turns of agents behind one system
	// prompt, a burst of one app) spread over the replicas that hold it and
	// the idle ones, in proportion to how long they are. Default 12 (the
	// fleet simulation's sweep, bench/EXPERIMENTS.md section 7); 0 turns
	// it off.
	PairWeight float64 `json:"pair_weight,omitempty"`
	// BlockTokens is the size of one fingerprint block, in tokens.
	BlockTokens int `json:"block_tokens,omitempty"`
	// PrefixTokens bounds how much of a prompt is fingerprinted, in tokens.
	PrefixTokens int `json:"prefix_tokens,omitempty"`
	// CharsPerToken converts prompt bytes to estimated tokens.
	CharsPerToken float64 `json:"chars_per_token,omitempty"`
	// IndexBudget is the memory budget of the approximate index, in bytes.
	IndexBudget int64 `json:"index_budget,omitempty"`
	// LongOutputTokens is the requested output length from which a request
	// prefers speculative-decoding engines when cache and load tie.
	LongOutputTokens int `json:"long_output_tokens,omitempty"`
	// TieEpsilon is the score difference under which two replicas tie.
	TieEpsilon float64 `json:"tie_epsilon,omitempty"`
	// OutputWeight adds OutputWeight x the requested output tokens to the
	// score of every replica whose engine profile fits the requested length
	// (speculative from LongOutputTokens on, standard below), so that a fast
	// decoder can outweigh warm cache for long outputs. The profile also
	// breaks ties. Default 4: a 1024-token output on a speculative engine
	// is worth 4096 tokens of warm prefix.
	OutputWeight float64 `json:"output_weight,omitempty"`
	// KVCapacity is every replica's KV cache capacity in tokens, for the
	// replicas whose capacity is not known otherwise (Router.SetCapacity,
	// fed from the engine's own metrics). The approximate index then
	// believes a replica holds at most this much of what ramjet sent it,
	// the least recently sent presumed evicted first. Default 0: unbounded.
	KVCapacity int64 `json:"kv_capacity,omitempty"`

	// Explicit lists the knobs of ZeroKnobs that were given explicitly, so
	// that SetDefaults keeps their zero: Config{Alpha: 0, Explicit:
	// KnobAlpha} is pure affinity. The module sets it from the presence of
	// the option in JSON or the Caddyfile. After SetDefaults every knob is
	// explicit.
	Explicit Knobs `json:"-"`
}

// SetDefaults fills every zero field with its default, except the knobs
// listed in Explicit.
func (c *Config) SetDefaults() {
	defer func() { c.Explicit = ZeroKnobs }()
	if c.AffinityCap == 0 {
		c.AffinityCap = DefaultAffinityCap
	}
	if c.Alpha == 0 && c.Explicit&KnobAlpha == 0 {
		c.Alpha = DefaultAlpha
	}
	if c.RequestCost == 0 && c.Explicit&KnobRequestCost == 0 {
		c.RequestCost = DefaultRequestCost
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = DefaultBlockTokens
	}
	if c.PrefixTokens == 0 {
		c.PrefixTokens = DefaultPrefixTokens
	}
	if c.CharsPerToken == 0 {
		c.CharsPerToken = DefaultCharsPerToken
	}
	if c.IndexBudget == 0 {
		c.IndexBudget = DefaultIndexBudget
	}
	if c.LongOutputTokens == 0 {
		c.LongOutputTokens = DefaultLongOutputTokens
	}
	if c.TieEpsilon == 0 && c.Explicit&KnobTieEpsilon == 0 {
		c.TieEpsilon = DefaultTieEpsilon
	}
	if c.OutputWeight == 0 && c.Explicit&KnobOutputWeight == 0 {
		c.OutputWeight = DefaultOutputWeight
	}
	if c.ContextWeight == 0 {
		c.ContextWeight = DefaultContextWeight // 0: zero is the default
	}
	if c.PairWeight == 0 && c.Explicit&KnobPairWeight == 0 {
		c.PairWeight = DefaultPairWeight
	}
}

// Validate rejects values that cannot work, naming the field.
func (c Config) Validate() error {
	switch {
	case c.AffinityCap <= 0:
		return fmt.Errorf("affinity_cap must be positive, got %d", c.AffinityCap)
	case c.Alpha < 0 || math.IsNaN(c.Alpha) || math.IsInf(c.Alpha, 0):
		return fmt.Errorf("alpha must be a finite number >= 0, got %v", c.Alpha)
	case c.RequestCost < 0:
		return fmt.Errorf("request_cost must be >= 0, got %d", c.RequestCost)
	case c.BlockTokens <= 0:
		return fmt.Errorf("block_tokens must be positive, got %d", c.BlockTokens)
	case c.PrefixTokens < c.BlockTokens:
		return fmt.Errorf("prefix_tokens must be at least block_tokens (%d), got %d", c.BlockTokens, c.PrefixTokens)
	case c.PrefixTokens/c.BlockTokens > 1<<16:
		return fmt.Errorf("prefix_tokens / block_tokens must be at most 65536 blocks, got %d", c.PrefixTokens/c.BlockTokens)
	case !(c.CharsPerToken >= 0.5 && c.CharsPerToken <= 64):
		return fmt.Errorf("chars_per_token must be between 0.5 and 64, got %v", c.CharsPerToken)
	case c.IndexBudget < 1<<16:
		return fmt.Errorf("index_budget must be at least 64KiB, got %d bytes", c.IndexBudget)
	case c.LongOutputTokens <= 0:
		return fmt.Errorf("long_output_tokens must be positive, got %d", c.LongOutputTokens)
	case !(c.TieEpsilon >= 0) || math.IsInf(c.TieEpsilon, 0):
		return fmt.Errorf("tie_epsilon must be a finite number >= 0, got %v", c.TieEpsilon)
	case !(c.OutputWeight >= 0) || math.IsInf(c.OutputWeight, 0):
		return fmt.Errorf("output_weight must be a finite number >= 0, got %v", c.OutputWeight)
	case !(c.ContextWeight >= 0) || math.IsInf(c.ContextWeight, 0):
		return fmt.Errorf("context_weight must be a finite number >= 0, got %v", c.ContextWeight)
	case !(c.PairWeight >= 0) || math.IsInf(c.PairWeight, 0):
		return fmt.Errorf("pair_weight must be a finite number >= 0, got %v", c.PairWeight)
	case c.KVCapacity < 0:
		return fmt.Errorf("kv_capacity must be >= 0, got %d", c.KVCapacity)
	}
	return nil
}

// blockBytes is the size of one fingerprint block in canonical prompt bytes.
func (c Config) blockBytes() int {
	n := int(float64(c.BlockTokens) * c.CharsPerToken)
	if n < 1 {
		n = 1
	}
	return n
}

// maxBlocks is how many blocks the bounded prefix holds.
func (c Config) maxBlocks() int { return c.PrefixTokens / c.BlockTokens }
