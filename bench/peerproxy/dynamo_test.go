package peerproxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// TestDynamoThroughCaddySeesTheEnginesKVEvents runs fleetsim's Dynamo
// policy through a real Caddy over engines that publish KV events over
// ZMQ: once a group's first request is answered and its blocks reached
// the adapter as events, each later request of the group (same system
// prompt, another user message) goes to that replica on an idle fleet,
// the only one with a lower prefill cost. The adapter's hashes of the
// prompt (the engine's token ids, the engine's chain hash) must equal the
// engines' own for that: with no match every replica ties and Dynamo
// draws among them at random.
func TestDynamoThroughCaddySeesTheEnginesKVEvents(t *testing.T) {
	var addrs, events []string
	for i := range 4 {
		s, err := enginesim.Start(context.Background(), enginesim.Options{Model: "sim", TimeScale: 1, Seed: uint64(i) + 1,
			KVEvents: enginesim.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		addrs, events = append(addrs, s.Addr()), append(events, s.KVEndpoints()[0])
	}
	a, running := startInCaddy(t, Config{Policy: "dynamo", Seed: 3, Upstreams: addrs, KVEvents: events})
	index := make(map[string]int)
	for i, ad := range addrs {
		index[ad] = i
	}
	send := func(g, k int) (rep int, prompt []uint32) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{
			"model": "sim", "max_tokens": 4,
			"messages": []map[string]string{
				{"role": "system", "content": engine.SyntheticText(uint64(100+g), 400)},
				{"role": "user", "content": engine.SyntheticText(uint64(k), 30)},
			},
		})
		resp, err := http.Post(running.URL("lb")+"/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("group %d request %d: %s", g, k, resp.Status)
		}
		rep, ok := index[resp.Header.Get(caddyrun.SpreadHeader)]
		if !ok {
			t.Fatalf("upstream %q", resp.Header.Get(caddyrun.SpreadHeader))
		}
		prompt, err = enginesim.PromptTokens(body, true)
		if err != nil {
			t.Fatal(err)
		}
		return rep, prompt
	}
	k := 0
	for g := range 3 {
		home, prompt := send(g, k)
		k++
		// The system prompt's blocks reach the adapter as the engine's events.
		rq := fleetsim.NewLiveRequest(workload.Request{}, prompt, true, 0, 16)
		deadline := time.Now().Add(30 * time.Second)
		for {
			a.mu.Lock()
			n := a.fleet[home].CachedBlocks(rq.EngineHashes())
			a.mu.Unlock()
			if n >= 25 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("group %d: replica %d holds %d blocks of the prompt after 30s (KV events applied: %d)", g, home, n, a.Stats().KVEvents)
			}
			time.Sleep(10 * time.Millisecond)
		}
		for range 2 {
			if rep, _ := send(g, k); rep != home {
				t.Errorf("group %d request %d went to replica %d, its prefix is on %d", g, k, rep, home)
			}
			k++
		}
	}
	// A body the engine cannot read is forwarded as is, answered by the
	// engine, and counted as not routed by the policy.
	resp, err := http.Post(running.URL("lb")+"/chat/completions", "application/json", strings.NewReader(`{"model":`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if st := a.Stats(); resp.StatusCode != http.StatusBadRequest || st.Fallbacks != 1 || st.Requests != k {
		t.Errorf("malformed body: %s, stats %+v (want 400, 1 fallback, %d requests)", resp.Status, st, k)
	}
}
