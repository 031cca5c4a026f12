package fleetsim

import (
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// resultDigest hashes every bit of a run's outcome: each record (floats by
// their shortest round-trip form), the per-replica routing counts and every
// engine's final counters.
func resultDigest(res *Result) uint64 {
	d := xxhash.New()
	for _, r := range res.Records {
		fmt.Fprintf(d, "%d %d %v %v %v %d %d %d %q\n", r.ID, r.Replica, r.Sent, r.First, r.Done, r.Prompt, r.Cached, r.Output, r.Err)
	}
	fmt.Fprintf(d, "%v\n", res.Routed)
	for _, s := range res.Engine {
		fmt.Fprintf(d, "%+v\n", s)
	}
	return d.Sum64()
}

// pinCase is one simulation whose outcome is pinned.
type pinCase struct {
	workload string
	replicas int
	policy   string
	seed     uint64
	kv       int // KV capacity in tokens; 0: the h200 preset's (fleetsim's default)
	want     uint64
}

func (c pinCase) name() string {
	return fmt.Sprintf("%s/%d/%s/seed%d/kv%d", c.workload, c.replicas, c.policy, c.seed, c.kv)
}

func (c pinCase) run(t *testing.T) *Result {
	t.Helper()
	w := generate(t, c.workload, workload.Options{Seed: c.seed, Replicas: c.replicas, Scale: 0.1})
	p, err := NewPolicy(c.policy, c.seed, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ecfg, err := engine.PresetConfig("h200")
	if err != nil {
		t.Fatal(err)
	}
	if c.kv > 0 {
		ecfg.CapacityTokens = c.kv
	}
	ecfg.MaxModelLen = 0
	res, err := Run(Config{Workload: w, Replicas: c.replicas, Policy: p, Salt: c.seed, Engine: ecfg})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestRunPinned pins the simulator's own results, bit for bit, on peers
// whose routing does not depend on ramjet's rule: a change to the event
// loop, the engine model, the workload generators or the token synthesis
// that moves any record, any engine counter or any routing count fails it.
// The digests were taken on main 16a4f8a, before the event loop kept each
// engine's next step time instead of asking all of them per event.
func TestRunPinned(t *testing.T) {
	tests := []pinCase{
		{"shared-prefix", 64, "round-robin", 1, 0, 0x38f8d14704bb1de5},
		{"shared-prefix", 64, "least-inflight", 2, 0, 0x8d2f3c8fa24fd24b},
		{"shared-prefix", 8, "dynamo", 1, 65536, 0x299a97a161ed30dd},
		{"agent-fleet", 16, "dynamo", 3, 0, 0xaeea1416c5dc9534},
		{"agent-fleet", 8, "least-inflight", 1, 65536, 0xc29a4bcaf56bb9a2},
		{"hotspot-600", 256, "least-inflight", 1, 0, 0x37b37eebf4db3360}, // hotspot before it scaled with the fleet
		{"burst", 32, "power-of-two", 2, 0, 0xfb34818ac15e0c4},
		{"locality", 8, "round-robin", 3, 0, 0xc156c329b0072614},
		{"spec-pair", 2, "round-robin", 1, 0, 0xab1d37b80d31c2cf},
	}
	for _, tt := range tests {
		t.Run(tt.name(), func(t *testing.T) {
			got := resultDigest(tt.run(t))
			if got != tt.want {
				t.Errorf("digest %#x, want %#x: the simulation's outcome moved", got, tt.want)
			}
		})
	}
}
