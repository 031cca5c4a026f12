package engine

import (
	"fmt"
	"time"
)

// Config holds every constant of the engine model. The zero value of a field
// means "use the default"; call SetDefaults then Validate, or use
// DefaultConfig. The defaults describe DefaultDeployment: Qwen3-32B with
// BF16 weights and KV cache, served by vLLM with its defaults on one H200
// (140.4 GiB, 4.8 TB/s HBM, 989 dense BF16 TFLOPS); every capacity and
// timing default is derived from it (deployment.go), as given per field.
type Config struct {
	// BlockSize is the number of tokens per KV cache block. Default 16
	// (vLLM's default block size on CUDA).
	BlockSize int

	// CapacityTokens is the KV cache capacity in tokens; the engine has
	// CapacityTokens/BlockSize blocks. Default 259136: vLLM's
	// gpu_memory_utilization 0.9 x 140.4 GiB = 126.4 GiB, less 61.1 GiB of
	// BF16 weights (32.8e9 x 2 B) and 2 GiB of activation and CUDA-graph
	// overhead, leaves 63.3 GiB of KV cache; at 256 KiB per token (2 (K,V)
	// x 64 layers x 8 KV heads x 128 dims x 2 B) that is 259,136 tokens in
	// whole 16-token blocks. (The "big-cache" preset keeps the earlier
	// 582,246, which would be 153 GB of KV at 256 KiB per token.)
	CapacityTokens int

	// MaxRunningSeqs is the most sequences decoded in one batch (vLLM
	// max_num_seqs). Default 1024: vLLM V1's default for the OpenAI server
	// on GPUs with at least 70 GiB other than A100
	// (vllm/engine/arg_utils.py, get_batch_defaults).
	MaxRunningSeqs int

	// MaxWaiting bounds the waiting queue; Submit returns ErrQueueFull past
	// it. Default 4096 (vLLM has no bound; the simulator needs one).
	MaxWaiting int

	// MaxModelLen is the longest context (prompt plus output) in tokens.
	// Default 40960 (Qwen3-32B's max_position_embeddings).
	MaxModelLen int

	// MaxBatchedTokens is the chunked-prefill token budget of one step
	// (vLLM max_num_batched_tokens). Default 8192 (vLLM V1's default for the
	// OpenAI server on GPUs with at least 70 GiB other than A100).
	MaxBatchedTokens int

	// StepBase is the fixed cost of one forward pass: reading the weights
	// once. Default 13.67ms (32.8e9 params x 2 bytes / 4.8 TB/s).
	StepBase time.Duration

	// TokenCompute is the compute cost of every token scheduled in a step
	// (prefill, decode and speculative verify tokens alike). Default
	// 132.7µs (2 x 32.8e9 FLOP per token at 50% of 989 TFLOPS).
	TokenCompute time.Duration

	// KVReadPerToken is the decode cost per token of context held by each
	// decoding sequence (attention reads its KV cache once per step).
	// Default 55ns (64 layers x 8 KV heads x 128 dims x 2 (K,V) x 2 bytes =
	// 256 KiB per token, at 4.8 TB/s). This makes the decode step time grow
	// with the number of running sequences and their lengths.
	KVReadPerToken time.Duration

	// PrefillAttnPerPair is the attention compute per (prefill token,
	// context position) pair, so the prefill cost per uncached token grows
	// with its position in the context. Default 4ns (4 x 64 layers x 64
	// heads x 128 dims = 2.1 MFLOP per pair at 50% of 989 TFLOPS).
	PrefillAttnPerPair time.Duration

	// SpecTokens is the speculative draft length k (tokens proposed per
	// step per sequence); 0 disables speculative decoding. Default 0.
	SpecTokens int

	// SpecAcceptance is the per-token probability that a draft token is
	// accepted, in [0,1]. Default 0.7 when SpecTokens > 0 (EAGLE-class
	// drafters report 0.6-0.8 on chat workloads).
	SpecAcceptance float64

	// SpecDraftCost is the cost of one draft position per step (the
	// drafter runs k times per step, whatever the batch). Default 1.5ms
	// (a ~0.6B drafter: weight read plus launch overhead).
	SpecDraftCost time.Duration

	// HashSeed seeds the chained block hashes, as vLLM's per-process
	// hash seed (PYTHONHASHSEED). Default 0.
	HashSeed uint64

	// Seed seeds the deterministic draws of speculative acceptance.
	// Default 0.
	Seed uint64
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	var c Config
	c.SetDefaults()
	return c
}

// SetDefaults fills zero fields with their documented defaults.
func (c *Config) SetDefaults() {
	setInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	setDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	DefaultDeployment.Apply(c)
	setInt(&c.MaxRunningSeqs, 1024)
	setInt(&c.MaxWaiting, 4096)
	setInt(&c.MaxModelLen, 40960)
	setInt(&c.MaxBatchedTokens, 8192)
	if c.SpecTokens > 0 {
		if c.SpecAcceptance == 0 {
			c.SpecAcceptance = 0.7
		}
		setDur(&c.SpecDraftCost, 1500*time.Microsecond)
	}
}

// Validate rejects bad values, naming the field.
func (c Config) Validate() error {
	switch {
	case c.BlockSize <= 0:
		return fmt.Errorf("BlockSize must be positive")
	case c.CapacityTokens < c.BlockSize:
		return fmt.Errorf("CapacityTokens must hold at least one block")
	case c.MaxRunningSeqs <= 0:
		return fmt.Errorf("MaxRunningSeqs must be positive")
	case c.MaxWaiting <= 0:
		return fmt.Errorf("MaxWaiting must be positive")
	case c.MaxModelLen <= 1:
		return fmt.Errorf("MaxModelLen must be at least 2")
	case c.MaxBatchedTokens <= 0:
		return fmt.Errorf("MaxBatchedTokens must be positive")
	case c.StepBase < 0 || c.TokenCompute < 0 || c.KVReadPerToken < 0 || c.PrefillAttnPerPair < 0 || c.SpecDraftCost < 0:
		return fmt.Errorf("step costs must not be negative")
	case c.StepBase+c.TokenCompute <= 0:
		return fmt.Errorf("StepBase or TokenCompute must be positive")
	case c.SpecTokens < 0:
		return fmt.Errorf("SpecTokens must not be negative")
	case c.SpecAcceptance < 0 || c.SpecAcceptance > 1:
		return fmt.Errorf("SpecAcceptance must be in [0,1]")
	case c.SpecTokens+1 > c.MaxBatchedTokens:
		return fmt.Errorf("MaxBatchedTokens must exceed SpecTokens")
	}
	return nil
}

// TotalBlocks is the number of KV blocks: CapacityTokens/BlockSize.
func (c Config) TotalBlocks() int { return c.CapacityTokens / c.BlockSize }
