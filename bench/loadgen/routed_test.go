package loadgen_test

import (
	"context"
	"net/http"
	"strings"
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

// TestResultTokenized: with a TokenizeLog shared by the engines, a request
// whose messages were tokenized before it was sent records the call's
// times (before its send); one never tokenized records none.
func TestResultTokenized(t *testing.T) {
	sim, err := enginesim.Start(context.Background(), enginesim.Options{Model: "sim", TimeScale: 50, Tokenized: &enginesim.TokenizeLog{}})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	resp, err := http.Post(sim.URL()+"/tokenize", "application/json",
		strings.NewReader(`{"model":"sim","messages":[{"role":"user","content":"hello there"}],"add_generation_prompt":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("tokenize: status %d", resp.StatusCode)
	}
	client, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: sim.URL() + "/v1", Model: "sim", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	res := client.Do(context.Background(), []loadgen.Message{{Role: "user", Content: "hello there"}}, 4, false)
	if !res.OK() || res.TokenizeStart == 0 || res.TokenizeStart > res.TokenizeEnd || res.TokenizeEnd > 0 {
		t.Fatalf("tokenized %v-%v (ok %v): want a call before the send", res.TokenizeStart, res.TokenizeEnd, res.OK())
	}
	res = client.Do(context.Background(), []loadgen.Message{{Role: "user", Content: "never tokenized"}}, 4, false)
	if !res.OK() || res.TokenizeStart != 0 || res.TokenizeEnd != 0 {
		t.Fatalf("tokenized %v-%v (ok %v): want none", res.TokenizeStart, res.TokenizeEnd, res.OK())
	}
}
