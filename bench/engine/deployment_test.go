package engine

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultDeploymentDerivation(t *testing.T) {
	d := DefaultDeployment
	if got := d.KVBytesPerToken(); got != 262144 {
		t.Errorf("KV bytes per token = %v, want 262144 (2 x 64 x 8 x 128 x 2)", got)
	}
	c := DefaultConfig()
	tests := []struct {
		name      string
		got, want time.Duration
	}{
		{"StepBase", c.StepBase, 13666667 * time.Nanosecond},
		{"TokenCompute", c.TokenCompute, 132659 * time.Nanosecond},
		{"KVReadPerToken", c.KVReadPerToken, 55 * time.Nanosecond},
		{"PrefillAttnPerPair", c.PrefillAttnPerPair, 4 * time.Nanosecond},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if c.CapacityTokens != 259136 || c.CapacityTokens%c.BlockSize != 0 {
		t.Errorf("CapacityTokens = %d, want 259136 in whole blocks", c.CapacityTokens)
	}
	// The KV cache must fit the GPU with the weights.
	if kv := float64(c.CapacityTokens) * d.KVBytesPerToken(); kv+d.WeightBytesTotal() > d.GPU.MemoryBytes {
		t.Errorf("KV %.1f GiB + weights %.1f GiB exceed the GPU's %.1f GiB", kv/gib, d.WeightBytesTotal()/gib, d.GPU.MemoryBytes/gib)
	}
	if c.MaxRunningSeqs != 1024 {
		t.Errorf("MaxRunningSeqs = %d, want vLLM's 1024", c.MaxRunningSeqs)
	}
}

func TestPresets(t *testing.T) {
	for _, p := range Presets() {
		if err := p.Config.Validate(); err != nil {
			t.Errorf("preset %s: %v", p.Name, err)
		}
	}
	big, err := PresetConfig("big-cache")
	if err != nil || big.CapacityTokens != 582246 || big.MaxRunningSeqs != 26 || big.StepBase != 20*time.Millisecond {
		t.Errorf("big-cache = %+v, %v", big, err)
	}
	fp8, err := PresetConfig("h100-fp8")
	if err != nil || fp8.CapacityTokens >= DefaultConfig().CapacityTokens || fp8.StepBase >= DefaultConfig().StepBase {
		t.Errorf("h100-fp8 = %+v, %v", fp8, err)
	}
	if _, err := PresetConfig("nope"); err == nil || !strings.Contains(err.Error(), "unknown engine preset") {
		t.Errorf("unknown preset: %v", err)
	}
}
