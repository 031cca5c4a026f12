package loadgen_test

import (
	"context"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
)

// TestResultRouted: a request answered by the engine simulator records
// how long it took to reach the engine (its X-Sim-Received header), after
// the send and before the first token.
func TestResultRouted(t *testing.T) {
	sim, err := enginesim.Start(context.Background(), enginesim.Options{Model: "sim", TimeScale: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	client, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: sim.URL() + "/v1", Model: "sim", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	res := client.Do(context.Background(), []loadgen.Message{{Role: "user", Content: "hello there"}}, 4, false)
	if !res.OK() {
		t.Fatalf("request failed: %s %s", res.Err, res.ErrMsg)
	}
	if res.Routed <= 0 || res.Routed > res.TTFT {
		t.Fatalf("routed %v: want in (0, TTFT %v]", res.Routed, res.TTFT)
	}
}
