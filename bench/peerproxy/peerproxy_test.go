package peerproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// startEngines starts n engine simulators in real time and returns their
// addresses.
func startEngines(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for i := range n {
		s, err := enginesim.Start(context.Background(), enginesim.Options{Model: "sim", TimeScale: 1, Seed: uint64(i) + 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		addrs = append(addrs, s.Addr())
	}
	return addrs
}

// chatBody is a streamed chat request: a system prompt of group g (sys
// tokens) and a user message of user tokens, distinct per k.
func chatBody(g, sys, k, user int) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": "sim", "stream": true, "max_tokens": 8000,
		"messages": []map[string]string{
			{"role": "system", "content": engine.SyntheticText(uint64(1000+g), sys)},
			{"role": "user", "content": engine.SyntheticText(uint64(k), user)},
		},
	})
	return b
}

// TestSGLangThroughCaddyRoutesAsFleetsim sends a sequence of requests
// through a real Caddy whose policy is fleetsim's SGLang (default and
// tuned) run by the Adapter, each sent once the one before it streams its
// first token, all kept in flight to the end, and checks that every one
// went to the replica fleetsim's own SGLang picks for the same prompts
// (the engine's token ids) with the same in-flight counts. Nothing ends
// while the sequence runs (8,000-token replies in real time), so the
// in-flight counts the policy reads are the same through HTTP as in the
// reference, and the decisions must be equal one for one.
func TestSGLangThroughCaddyRoutesAsFleetsim(t *testing.T) {
	addrs := startEngines(t, 4)
	// Groups 0-2 share system prompts of 400 tokens (a warm match well
	// over the cache threshold); group 3's prompt is mostly its user part
	// (a match under it: routed as a miss).
	type step struct{ g, sys, user int }
	var seq []step
	for k := range 14 {
		switch k % 5 {
		case 0, 2:
			seq = append(seq, step{0, 400, 40})
		case 1:
			seq = append(seq, step{1, 400, 40})
		case 3:
			seq = append(seq, step{2, 400, 60})
		default:
			seq = append(seq, step{3, 40, 400})
		}
	}
	for _, pol := range []string{"sglang", "sglang-tuned"} {
		t.Run(pol, func(t *testing.T) {
			metrics := make([]string, len(addrs))
			for i, a := range addrs {
				metrics[i] = "http://" + a + "/metrics"
			}
			a, running := startInCaddy(t, Config{Policy: pol, Seed: 1, Upstreams: addrs, Metrics: metrics})

			// The reference: fleetsim's policy over a fleet with the same
			// in-flight counts.
			ref, err := fleetsim.NewPolicy(pol, 1, selection.Config{})
			if err != nil {
				t.Fatal(err)
			}
			fleet := make([]*fleetsim.Replica, len(addrs))
			for i := range fleet {
				fleet[i] = fleetsim.NewLiveReplica(i, false, 0, &liveEngine{}, false)
			}
			index := make(map[string]int)
			for i, ad := range addrs {
				index[ad] = i
			}
			var got, want []int
			hc := &http.Client{}
			for k, s := range seq {
				body := chatBody(s.g, s.sys, k, s.user)
				prompt, err := enginesim.PromptTokens(body, true)
				if err != nil {
					t.Fatal(err)
				}
				rq := fleetsim.NewLiveRequest(workload.Request{ID: k, Input: len(prompt), After: -1}, prompt, false, 0, 16)
				rep := ref.Pick(rq, fleet)
				fleet[rep].Routed++
				fleet[rep].InFlight++
				ref.Routed(rq, rep)
				want = append(want, rep)

				resp, err := hc.Post(running.URL("lb")+"/chat/completions", "application/json", strings.NewReader(string(body)))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %s", k, resp.Status)
				}
				// The first token: the request was routed and is in flight.
				if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
					t.Fatalf("request %d: %v", k, err)
				}
				up, ok := index[resp.Header.Get(caddyrun.SpreadHeader)]
				if !ok {
					t.Fatalf("request %d: upstream %q", k, resp.Header.Get(caddyrun.SpreadHeader))
				}
				got = append(got, up)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("replicas by request (-fleetsim +through Caddy):\n%s", diff)
			}
			// The sequence must exercise both paths: warm matches on a
			// busy replica and misses spread to idle ones.
			used := map[int]bool{}
			for _, r := range want {
				used[r] = true
			}
			if len(used) < 3 {
				t.Errorf("fleetsim's %s used %d replicas of 4 (%v): the sequence does not separate anything", pol, len(used), want)
			}
			st := a.Stats()
			if st.Requests != len(seq) || st.Picks != len(seq) || st.Fallbacks != 0 {
				t.Errorf("stats %+v, want %d requests and picks, no fallback", st, len(seq))
			}
			t.Logf("%s: %v", pol, want)
		})
	}
}

// startInCaddy starts the adapter cfg configures and a real Caddy whose
// one site ("lb") routes over cfg.Upstreams with it (the bench_peer
// handler and policy); both stop at the test's end.
func startInCaddy(t *testing.T, cfg Config) (*Adapter, *caddyrun.Running) {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a.Start(ctx)
	t.Cleanup(func() { a.Close() })
	t.Cleanup(Register(t.Name(), a))
	site := caddyrun.Site{Name: "lb", Policy: "bench_peer", PolicyConfig: map[string]any{"name": t.Name()},
		Upstreams: cfg.Upstreams, Handlers: []map[string]any{{"handler": "bench_peer", "name": t.Name()}}}
	running, err := caddyrun.Start([]caddyrun.Site{site})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddyrun.Stop() })
	return a, running
}

// TestAbortedResponseEndsTheRequest checks that a request whose response
// reverse_proxy aborts (the client closes the stream after its first
// event: Caddy's copy fails and it panics with http.ErrAbortHandler) ends
// in the policy as one that completes does: its replica's in-flight count
// (SGLang's load) returns to 0. Before the handler deferred Done, the
// abort path left it in flight for the rest of the run (a replay of
// shared-prefix leaked a few such counts, which steered SGLang's
// least-loaded choices away from the replicas holding them).
func TestAbortedResponseEndsTheRequest(t *testing.T) {
	addrs := startEngines(t, 2)
	a, running := startInCaddy(t, Config{Policy: "sglang", Seed: 1, Upstreams: addrs})
	inFlight := func() int {
		n := 0
		for _, c := range a.Stats().InFlight {
			n += c
		}
		return n
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for k := range 3 {
		resp, err := hc.Post(running.URL("lb")+"/chat/completions", "application/json", strings.NewReader(string(chatBody(k, 64, k, 16))))
		if err != nil {
			t.Fatal(err)
		}
		// The first event: routed, streaming 8,000 tokens in real time.
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		if n := inFlight(); n != 1 {
			t.Fatalf("request %d streaming: %d in flight, want 1", k, n)
		}
		resp.Body.Close() // unread: the transport closes the connection
		deadline := time.Now().Add(10 * time.Second)
		for inFlight() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("request %d aborted: still in flight after 10s: %v", k, a.Stats().InFlight)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if st := a.Stats(); st.Requests != 3 || st.Picks != 3 {
		t.Errorf("stats %+v, want 3 requests and picks", st)
	}
}
