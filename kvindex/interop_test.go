package kvindex

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// The engine simulator in each publisher convention, on real ZMQ sockets:
// the subscriber binds (the simulator's PUB connects) or dials, the
// encoding is positional or keyed, chain starts are nil or 0, sequences
// start at 0 or 1, replays carry a topic frame or not. After warm-up the
// precise index agrees with the engine's cached_tokens.
func TestInteropConventions(t *testing.T) {
	for _, tc := range []struct {
		name                                      string
		bind, parentZero, seqFromOne, replayTopic bool
		enc                                       enginesim.KVEncoding
	}{
		{name: "vllm-dial-array", enc: enginesim.KVEncodingArray},
		{name: "dial-map-seq1-replaytopic", seqFromOne: true, replayTopic: true, enc: enginesim.KVEncodingMap},
		{name: "dial-array-parent0", parentZero: true, enc: enginesim.KVEncodingArray},
		{name: "bind-array-parent0-seq1", bind: true, parentZero: true, seqFromOne: true, enc: enginesim.KVEncodingArray},
		{name: "bind-map", bind: true, enc: enginesim.KVEncodingMap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const topic = "kv@127.0.0.1:8000@qwen3-32b"
			x := New(Config{BlockSize: 16})
			ko := enginesim.KVEventsOptions{Topic: topic, Encoding: tc.enc, ParentZero: tc.parentZero,
				SeqFromOne: tc.seqFromOne, ReplayTopic: tc.replayTopic}
			start := func() *enginesim.Server {
				sim, err := enginesim.Start(context.Background(), enginesim.Options{Instant: true,
					Engine: engine.Config{BlockSize: 16, CapacityTokens: 1024 * 16}, KVEvents: ko})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sim.Close() })
				return sim
			}
			var sim *enginesim.Server
			if tc.bind {
				bind := "tcp://127.0.0.1:0"
				s := startSub(t, x, Endpoint{Replica: "e", Events: bind, Topic: topic, Bind: true})
				eventually(t, "the subscriber listening", func() bool { ko.Endpoint = s.BoundAddr(bind); return ko.Endpoint != "" })
				ko.Connect = true
				sim = start()
			} else {
				ko.Endpoint, ko.ReplayEndpoint = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
				sim = start()
				startSub(t, x, Endpoint{Replica: "e", Events: sim.KVEndpoints()[0],
					Replay: sim.KVReplayEndpoints()[0], Topic: topic})
			}
			r, _ := x.Lookup("e")
			// Warm-up: requests until the index has seen one land (ZMQ
			// drops what is published before the subscription arrives).
			for i := 0; ; i++ {
				p := engine.SyntheticTokens(nil, uint64(1000+i), 40)
				complete(t, sim, p)
				ok := false
				for range 50 {
					if overlapOf(x, r, p) == 32 {
						ok = true
						break
					}
					eventuallyTick()
				}
				if ok {
					break
				}
				if i == 100 {
					t.Fatalf("no store landed: %+v", x.Stats(r))
				}
			}
			shared := engine.SyntheticTokens(nil, 7, 48)
			agree := 0
			var prev []uint32
			for i := range 12 {
				// Conversations of three turns over a shared system prompt.
				base := shared
				if i%3 != 0 {
					base = prev
				}
				p := append(append([]uint32(nil), base...), engine.SyntheticTokens(nil, uint64(i), 20+i%5)...)
				prev = p
				want := overlapOf(x, r, p)
				got := complete(t, sim, p)
				if got != want {
					t.Errorf("request %d: engine cached %d, index %d", i, got, want)
				} else {
					agree++
				}
				eventually(t, "the request's blocks indexed", func() bool { return overlapOf(x, r, p) == len(p)/16*16 })
			}
			st := x.Stats(r)
			if !st.Fresh || !st.Healthy || x.Orphans() != 0 || st.Entries < 15 {
				t.Errorf("stats %+v, orphans %d", st, x.Orphans())
			}
			if !tc.bind && !st.Complete {
				t.Errorf("a dialled feed with replay is not complete: %+v", st)
			}
			t.Logf("%d/12 agree; stats %+v", agree, st)
		})
	}
}

func eventuallyTick() { <-time.After(5 * time.Millisecond) }

// complete sends one completion of prompt to the simulator and returns its
// cached_tokens.
func complete(t *testing.T, sim *enginesim.Server, prompt []uint32) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": sim.Model(), "prompt": prompt, "max_tokens": 1})
	resp, err := http.Post(sim.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(fmt.Errorf("completion: %w", err))
	}
	return out.Usage.Details.Cached
}
