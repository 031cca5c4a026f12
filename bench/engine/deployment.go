package engine

import (
	"fmt"
	"time"
)

// GPU is the hardware one engine runs on: what the timing model and the KV
// capacity are derived from.
type GPU struct {
	// Name is the product name.
	Name string
	// MemoryBytes is the device memory the driver reports (nvidia-smi's
	// memory.total), in bytes.
	MemoryBytes float64
	// Bandwidth is the HBM bandwidth, bytes per second.
	Bandwidth float64
	// DenseFLOPS is the dense (no sparsity) tensor throughput at the
	// weights' precision, FLOP per second.
	DenseFLOPS float64
}

// Model is a dense decoder-only transformer, as its config.json states it.
type Model struct {
	// Name is the Hugging Face model id.
	Name string
	// Params is the parameter count.
	Params float64
	// Layers, QueryHeads, KVHeads and HeadDim are num_hidden_layers,
	// num_attention_heads, num_key_value_heads and head_dim.
	Layers, QueryHeads, KVHeads, HeadDim int
}

// Deployment is a model served by vLLM on one GPU: everything the engine
// model's defaults are derived from.
type Deployment struct {
	GPU   GPU
	Model Model
	// WeightBytes is bytes per parameter (2 for BF16, 1 for FP8).
	WeightBytes float64
	// KVBytes is bytes per cached K or V element (2 for BF16, 1 for FP8).
	KVBytes float64
	// MemoryUtilization is vLLM's gpu_memory_utilization (default 0.9).
	MemoryUtilization float64
	// OverheadBytes is what vLLM's memory profile keeps besides weights
	// and KV: the activation peak of a max_num_batched_tokens forward
	// pass, non-torch allocations and CUDA graphs.
	OverheadBytes float64
	// Efficiency is the fraction of DenseFLOPS a forward pass reaches.
	Efficiency float64
}

const gib = 1 << 30

// The hardware and models the presets use. Sources: NVIDIA's H100 SXM and
// H200 SXM datasheets (3.35 and 4.8 TB/s HBM, 989 dense BF16 TFLOPS, 1979
// dense FP8 TFLOPS); memory.total as nvidia-smi reports it (81,559 MiB for
// an H100 80GB, 143,771 MiB for an H200); Qwen3-32B's config.json (64
// layers, 64 query heads, 8 KV heads, head_dim 128; 32.8e9 parameters).
var (
	H100SXM = GPU{Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 81559 << 20, Bandwidth: 3.35e12, DenseFLOPS: 989e12}
	H200SXM = GPU{Name: "NVIDIA H200", MemoryBytes: 143771 << 20, Bandwidth: 4.8e12, DenseFLOPS: 989e12}

	Qwen3_32B = Model{Name: "Qwen/Qwen3-32B", Params: 32.8e9, Layers: 64, QueryHeads: 64, KVHeads: 8, HeadDim: 128}
)

// DefaultDeployment is what Config's defaults describe: Qwen3-32B, BF16
// weights and KV cache, served by vLLM (gpu_memory_utilization 0.9) on one
// H200. vLLM's own log for this deployment reads "Model loading took
// 61.4 GiB" and "Available KV cache memory: 63.4 GiB"; the model below
// gives 0.9 x 140.4 GiB = 126.4 GiB, less 61.1 GiB of weights and 2 GiB of
// overhead: 63.3 GiB of KV cache, 259,136 tokens at 256 KiB per token.
var DefaultDeployment = Deployment{
	GPU: H200SXM, Model: Qwen3_32B, WeightBytes: 2, KVBytes: 2,
	MemoryUtilization: 0.9, OverheadBytes: 2 * gib, Efficiency: 0.5,
}

// KVBytesPerToken is the KV cache one token takes: K and V for every layer
// and KV head (2 x 64 x 8 x 128 x 2 B = 256 KiB for Qwen3-32B in BF16).
func (d Deployment) KVBytesPerToken() float64 {
	return 2 * float64(d.Model.Layers*d.Model.KVHeads*d.Model.HeadDim) * d.KVBytes
}

// WeightBytesTotal is the weights' size in bytes.
func (d Deployment) WeightBytesTotal() float64 { return d.Model.Params * d.WeightBytes }

// KVCacheBytes is the memory vLLM gives the KV cache:
// MemoryUtilization x device memory, less weights and overhead.
func (d Deployment) KVCacheBytes() float64 {
	return d.MemoryUtilization*d.GPU.MemoryBytes - d.WeightBytesTotal() - d.OverheadBytes
}

// CapacityTokens is the KV cache capacity in tokens, whole blocks of
// blockSize tokens.
func (d Deployment) CapacityTokens(blockSize int) int {
	tokens := int(d.KVCacheBytes() / d.KVBytesPerToken())
	return tokens / blockSize * blockSize
}

func dur(seconds float64) time.Duration { return time.Duration(seconds*1e9 + 0.5) }

// StepBase is one forward pass's weight read: weights / bandwidth.
func (d Deployment) StepBase() time.Duration {
	return dur(d.WeightBytesTotal() / d.GPU.Bandwidth)
}

// TokenCompute is the linear-layer compute per scheduled token:
// 2 x params FLOP at Efficiency x DenseFLOPS.
func (d Deployment) TokenCompute() time.Duration {
	return dur(2 * d.Model.Params / (d.Efficiency * d.GPU.DenseFLOPS))
}

// KVReadPerToken is one decode step's read of one context token's KV:
// KVBytesPerToken / bandwidth.
func (d Deployment) KVReadPerToken() time.Duration {
	return time.Duration(d.KVBytesPerToken()/d.GPU.Bandwidth*1e9 + 0.5)
}

// PrefillAttnPerPair is the attention compute per (query token, context
// position) pair: QK^T and PV, 2 FLOP each per head dimension, for every
// layer and query head (4 x 64 x 64 x 128 = 2.1 MFLOP for Qwen3-32B), at
// Efficiency x DenseFLOPS.
func (d Deployment) PrefillAttnPerPair() time.Duration {
	f := 4 * float64(d.Model.Layers*d.Model.QueryHeads*d.Model.HeadDim)
	return time.Duration(f/(d.Efficiency*d.GPU.DenseFLOPS)*1e9 + 0.5)
}

// Apply fills c's zero capacity and timing fields from d.
func (d Deployment) Apply(c *Config) {
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.CapacityTokens == 0 {
		c.CapacityTokens = d.CapacityTokens(c.BlockSize)
	}
	if c.StepBase == 0 {
		c.StepBase = d.StepBase()
	}
	if c.TokenCompute == 0 {
		c.TokenCompute = d.TokenCompute()
	}
	if c.KVReadPerToken == 0 {
		c.KVReadPerToken = d.KVReadPerToken()
	}
	if c.PrefillAttnPerPair == 0 {
		c.PrefillAttnPerPair = d.PrefillAttnPerPair()
	}
}

// Preset is a named engine configuration.
type Preset struct {
	Name    string
	Summary string
	Config  Config
}

// Presets are the named engine configurations (the fleet simulation's
// -engine flag). The first is the default.
func Presets() []Preset {
	h100fp8 := Deployment{
		GPU: H100SXM, Model: Qwen3_32B, WeightBytes: 1, KVBytes: 2,
		MemoryUtilization: 0.9, OverheadBytes: 2 * gib, Efficiency: 0.5,
	}
	// Attention stays in BF16; the linear layers run on FP8 tensor cores.
	fp8 := Config{PrefillAttnPerPair: h100fp8.PrefillAttnPerPair()}
	h100fp8.GPU.DenseFLOPS = 1979e12
	h100fp8.Apply(&fp8)
	return []Preset{
		{Name: "h200", Summary: "Qwen3-32B BF16 on one H200, vLLM defaults (259,136-token KV cache, max_num_seqs 1024)", Config: DefaultConfig()},
		{Name: "h100-fp8", Summary: "Qwen3-32B FP8 weights, BF16 KV, on one H100 80GB (" + fmt.Sprint(fp8.CapacityTokens) + "-token KV cache)", Config: withDefaults(fp8)},
		{Name: "big-cache", Summary: "the earlier defaults: 582,246-token KV cache (153 GB at 256 KiB/token), max_num_seqs 26, H100 timing",
			Config: withDefaults(Config{
				CapacityTokens: 582246, MaxRunningSeqs: 26,
				StepBase: 20 * time.Millisecond, TokenCompute: 130 * time.Microsecond,
				KVReadPerToken: 78 * time.Nanosecond, PrefillAttnPerPair: 4 * time.Nanosecond,
			})},
	}
}

func withDefaults(c Config) Config {
	c.SetDefaults()
	return c
}

// PresetConfig returns the named preset's configuration.
func PresetConfig(name string) (Config, error) {
	var names []string
	for _, p := range Presets() {
		if p.Name == name {
			return p.Config, nil
		}
		names = append(names, p.Name)
	}
	return Config{}, fmt.Errorf("unknown engine preset %q (want one of %v)", name, names)
}
