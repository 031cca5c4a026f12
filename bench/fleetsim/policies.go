package fleetsim

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// PolicyNames lists every policy in table order: ramjet first, then the
// peers.
var PolicyNames = []string{
	"ramjet", "round-robin", "least-inflight", "power-of-two",
	"bounded-hash", "sglang", "dynamo", "llm-d",
}

// Variants are extra policies, not run by default: proposed changes to
// ramjet's rule, run through the real selection code (see
// NewRamjetMarginal and NewRamjetContext).
var Variants = []string{"ramjet-marginal", "ramjet-context"}

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

	DynamoOverlapWeight = 1.0

	LLMDPrefixWeight = 3
	LLMDQueueWeight  = 2
	LLMDKVWeight     = 2
	LLMDBlockTokens  = 16 // 64 characters at 4 per token
	LLMDMaxBlocks    = 256
	LLMDLRUCapacity  = 31250
)

// NewPolicy returns a fresh policy by name. seed drives the random
// choices of the peers that make them; ramjet takes cfg.
func NewPolicy(name string, seed uint64, cfg selection.Config) (Policy, error) {
	rng := rand.New(rand.NewPCG(seed, 0x706f6c696379))
	switch name {
	case "ramjet":
		return NewRamjet(cfg)
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
	case "dynamo":
		return &Dynamo{OverlapWeight: DynamoOverlapWeight, rng: rng}, nil
	case "llm-d":
		return &LLMD{
			PrefixWeight: LLMDPrefixWeight, QueueWeight: LLMDQueueWeight, KVWeight: LLMDKVWeight,
			BlockTokens: LLMDBlockTokens, MaxBlocks: LLMDMaxBlocks, LRUCapacity: LLMDLRUCapacity, rng: rng,
		}, nil
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
