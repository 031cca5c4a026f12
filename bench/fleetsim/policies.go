package fleetsim

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// PolicyNames lists every policy in table order: ramjet first, then the
// peers.
var PolicyNames = []string{
	"ramjet", "round-robin", "least-inflight", "power-of-two",
	"bounded-hash", "sglang", "sglang-tuned", "dynamo", "dynamo-tuned", "llm-d", "llm-d-precise",
}

// Variants are extra policies, not run by default: proposed changes to
// ramjet's rule, run through the real selection code (see
// NewRamjetMarginal and NewRamjetContext).
var Variants = []string{"ramjet-marginal", "ramjet-context", "ramjet-precise"}

// RamjetContextWeight is the context weight of the "ramjet-context"
// variant (see NewRamjetContext).
var RamjetContextWeight = 0.1

// Peer defaults, each from its project's published configuration (see the
// type comments for the source).
const (
	BoundedHashPrefixTokens = 256
	BoundedHashLoadFactor   = 1.25
	BoundedHashVirtualNodes = 160

	SGLangCacheThreshold = 0.3
	SGLangBalanceAbs     = 64
	SGLangBalanceRel     = 1.5
	SGLangMaxTreeSize    = 1 << 26
	SGLangBlockTokens    = 16

	// The tuned SGLang variant: what operators lower the thresholds to
	// (balance_abs_threshold about 1, so that any imbalance is corrected at
	// once; cache_threshold 0.2, so that shorter matches still follow the
	// cache).
	SGLangTunedCacheThreshold = 0.2
	SGLangTunedBalanceAbs     = 1

	DynamoOverlapWeight = 1.0
	DynamoTemperature   = 0.0
	// The tuned Dynamo variant: a published production setting of
	// Dynamo's KV router (router_overlap_score_weight 3.5,
	// router_temperature 0.05; Baseten's BIS-LLM b10_routing_config
	// defaults), cache reuse weighted above load, with a little
	// randomness against herding.
	DynamoTunedOverlapWeight = 3.5
	DynamoTunedTemperature   = 0.05

	LLMDPrefixWeight = 3
	LLMDQueueWeight  = 2
	LLMDKVWeight     = 2
	LLMDBlockTokens  = 16 // 64 characters at 4 per token
	LLMDMaxBlocks    = 256
	LLMDLRUCapacity  = 31250

	// llm-d's precise-prefix-cache-aware guide profile
	// (guides/precise-prefix-cache-aware/scheduler/
	// precise-prefix-cache-aware.values.yaml): precise-prefix-cache-scorer
	// x 2, kv-cache-utilization-scorer x 1, queue-scorer x 1.
	LLMDPrecisePrefixWeight = 2
	LLMDPreciseQueueWeight  = 1
	LLMDPreciseKVWeight     = 1
)

// NewPolicy returns a fresh policy by name. seed drives the random
// choices of the peers that make them; ramjet takes cfg.
func NewPolicy(name string, seed uint64, cfg selection.Config) (Policy, error) {
	rng := rand.New(rand.NewPCG(seed, 0x706f6c696379))
	switch name {
	case "ramjet":
		return NewRamjetVariant(cfg, RamjetSetup{EngineLoad: RamjetEngineLoad}, name)
	case "ramjet-marginal":
		return NewRamjetMarginal(cfg)
	case "ramjet-context":
		return NewRamjetContext(cfg, RamjetContextWeight)
	case "round-robin":
		return &RoundRobin{}, nil
	case "least-inflight":
		return &LeastInFlight{rng: rng}, nil
	case "power-of-two":
		return &PowerOfTwo{rng: rng}, nil
	case "bounded-hash":
		return &BoundedHash{PrefixTokens: BoundedHashPrefixTokens, LoadFactor: BoundedHashLoadFactor, VirtualNodes: BoundedHashVirtualNodes}, nil
	case "sglang":
		return &SGLang{
			CacheThreshold: SGLangCacheThreshold, BalanceAbs: SGLangBalanceAbs, BalanceRel: SGLangBalanceRel,
			BlockTokens: SGLangBlockTokens, MaxTreeSize: SGLangMaxTreeSize,
		}, nil
	case "sglang-tuned":
		return &SGLang{
			CacheThreshold: SGLangTunedCacheThreshold, BalanceAbs: SGLangTunedBalanceAbs, BalanceRel: SGLangBalanceRel,
			BlockTokens: SGLangBlockTokens, MaxTreeSize: SGLangMaxTreeSize, Label: name,
		}, nil
	case "dynamo":
		return &Dynamo{OverlapWeight: DynamoOverlapWeight, Temperature: DynamoTemperature, rng: rng}, nil
	case "dynamo-sum":
		return &Dynamo{OverlapWeight: DynamoOverlapWeight, Temperature: DynamoTemperature, Label: name, SumActive: true, rng: rng}, nil
	case "dynamo-nodecode":
		return &Dynamo{OverlapWeight: DynamoOverlapWeight, Temperature: DynamoTemperature, Label: name, NoDecode: true, rng: rng}, nil
	case "dynamo-tuned":
		return &Dynamo{OverlapWeight: DynamoTunedOverlapWeight, Temperature: DynamoTunedTemperature, Label: name, rng: rng}, nil
	case "llm-d":
		return &LLMD{
			PrefixWeight: LLMDPrefixWeight, QueueWeight: LLMDQueueWeight, KVWeight: LLMDKVWeight,
			BlockTokens: LLMDBlockTokens, MaxBlocks: LLMDMaxBlocks, LRUCapacity: LLMDLRUCapacity, rng: rng,
		}, nil
	case "llm-d-precise":
		return llmdPrecise{&LLMD{
			PrefixWeight: LLMDPrecisePrefixWeight, QueueWeight: LLMDPreciseQueueWeight, KVWeight: LLMDPreciseKVWeight,
			Precise: true, Label: name, rng: rng,
		}}, nil
	}
	if p, ok, err := preciseNamed(name, cfg); ok { // ramjet-precise and its variants
		return p, err
	}
	if p, ok, err := ramjetNamed(name, cfg); ok {
		return p, err
	}
	return nil, fmt.Errorf("unknown policy %q (want one of %s, %s)", name, strings.Join(PolicyNames, ", "), strings.Join(Variants, ", "))
}

// OracleShare is the cached-prompt-token share an infinite prefix cache
// shared by the whole fleet would reach on the trace: requests in trace
// order, each hitting every full block (of blockSize tokens, at most
// prompt-1 tokens, as the engine) that any earlier request's prompt or
// output filled. No routing can beat it on any replica count.
func OracleShare(w *workload.Workload, salt uint64, blockSize int) (share float64, cached, prompt int64) {
	seen := make(map[uint64]struct{})
	synth := workload.Synth{Salt: salt}
	var toks []uint32
	var blocks []uint64
	for _, r := range w.Trace {
		toks = synth.Prompt(toks[:0], r)
		usable := (len(toks) - 1) / blockSize
		blocks = selection.AppendTokenBlocks(blocks[:0], 0, toks, blockSize)
		hits := 0
		for hits < usable && hits < len(blocks) {
			if _, ok := seen[blocks[hits]]; !ok {
				break
			}
			hits++
		}
		cached += int64(hits * blockSize)
		prompt += int64(len(toks))
		toks = synth.Completion(toks, r)
		blocks = selection.AppendTokenBlocks(blocks[:0], 0, toks, blockSize)
		for _, b := range blocks {
			seen[b] = struct{}{}
		}
	}
	if prompt > 0 {
		share = float64(cached) / float64(prompt)
	}
	return share, cached, prompt
}

// PooledOracleShare is the cached-prompt-token share of one LRU prefix
// cache of capacityBlocks blocks (the whole fleet's KV capacity pooled)
// on the trace: requests in arrival order with zero service time (ZeroWait
// order: a closed-loop turn arrives its think time after the one it
// follows), each hitting the leading full blocks present (at most
// prompt-1 tokens, as the engine), then touching its prompt's and output's
// blocks, least recently used evicted first. It is what routing could
// reach if the fleet's caches were one; the infinite-cache OracleShare
// drops the capacity limit as well.
func PooledOracleShare(w *workload.Workload, salt uint64, blockSize, capacityBlocks int) (share float64, cached, prompt int64) {
	lru := newLRUSet(max(1, capacityBlocks))
	synth := workload.Synth{Salt: salt}
	var toks []uint32
	var blocks []uint64
	for _, id := range ZeroWaitOrder(w.Trace) {
		r := w.Trace[id]
		toks = synth.Prompt(toks[:0], r)
		usable := (len(toks) - 1) / blockSize
		blocks = selection.AppendTokenBlocks(blocks[:0], 0, toks, blockSize)
		hits := 0
		for hits < usable && hits < len(blocks) && lru.has(blocks[hits]) {
			hits++
		}
		cached += int64(hits * blockSize)
		prompt += int64(len(toks))
		toks = synth.Completion(toks, r)
		blocks = selection.AppendTokenBlocks(blocks[:0], 0, toks, blockSize)
		// Deepest first, so that a prefix's leading blocks are the most
		// recent (the engine evicts the deepest blocks of a prefix first).
		for i := len(blocks) - 1; i >= 0; i-- {
			lru.add(blocks[i])
		}
	}
	if prompt > 0 {
		share = float64(cached) / float64(prompt)
	}
	return share, cached, prompt
}

// ZeroWaitOrder returns the trace's row IDs in the order they would arrive
// if every request completed the instant it was sent: an open-loop row at
// At, a closed-loop row Think after the row it follows (and not before
// At); ties keep trace order. Closed-loop sessions then interleave as they
// do in a run, rather than one after another as in the trace.
func ZeroWaitOrder(t workload.Trace) []int {
	at := make([]float64, len(t))
	ids := make([]int, len(t))
	for i, r := range t {
		at[i] = r.At
		if r.After >= 0 {
			at[i] = max(r.At, at[r.After]+r.Think)
		}
		ids[i] = i
	}
	sort.SliceStable(ids, func(a, b int) bool { return at[ids[a]] < at[ids[b]] })
	return ids
}
