package kvindex

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// End to end against the real engine simulator (bench/enginesim): its
// HTTP API, its /tokenize, its ZMQ publisher and replay socket, two
// data-parallel ranks. The index built from the events must predict the
// cached_tokens each rank reports, through restarts and a lost feed.

type simHarness struct {
	t    *testing.T
	s    *enginesim.Server
	x    *Index
	tk   *Tokenizer
	reps []Replica
	bs   int
}

// consecutivePorts returns a 127.0.0.1 port p such that p and p+1 were
// free a moment ago (a data-parallel rank offsets its ports by its rank).
func consecutivePorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		a.Close()
		if err == nil {
			b.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

func simOptions(enc enginesim.KVEncoding, h enginesim.HashEncoding, events, replay string) enginesim.Options {
	const bs = 16
	return enginesim.Options{
		Instant: true, DP: 2,
		Engine: engine.Config{BlockSize: bs, CapacityTokens: 28 * bs, MaxModelLen: 8192},
		KVEvents: enginesim.KVEventsOptions{Endpoint: events, ReplayEndpoint: replay,
			Encoding: enc, HashEncoding: h, Topic: "kv-events"},
	}
}

func startSim(t *testing.T, enc enginesim.KVEncoding, h enginesim.HashEncoding) *simHarness {
	const bs = 16
	// ZMQ binds the chosen ports itself (rank i on port+i): another
	// process may take one between consecutivePorts and the bind, so the
	// whole start is retried on EADDRINUSE.
	var s *enginesim.Server
	var err error
	for attempt := 0; ; attempt++ {
		events := fmt.Sprintf("tcp://127.0.0.1:%d", consecutivePorts(t))
		replay := fmt.Sprintf("tcp://127.0.0.1:%d", consecutivePorts(t))
		s, err = enginesim.Start(context.Background(), simOptions(enc, h, events, replay))
		if err == nil {
			break
		}
		inUse := errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
		if attempt == 4 || !inUse {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { s.Close() })
	x := New(Config{BlockSize: bs})
	var eps []Endpoint
	for i, ev := range s.KVEndpoints() {
		eps = append(eps, Endpoint{Replica: s.Addr() + "#" + strconv.Itoa(i), Events: ev,
			Replay: s.KVReplayEndpoints()[i], Topic: "kv-events"})
	}
	startSub(t, x, eps...)
	hs := &simHarness{t: t, s: s, x: x, bs: bs, tk: NewTokenizer(TokenizerConfig{Timeout: 5 * time.Second})}
	for _, ep := range eps {
		r, _ := x.Lookup(ep.Replica)
		hs.reps = append(hs.reps, r)
	}
	return hs
}

func chatReq(model, system string, turns []string) TokenizeRequest {
	msgs := []map[string]string{{"role": "system", "content": system}}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": t})
	}
	b, _ := json.Marshal(msgs)
	return TokenizeRequest{Model: model, Messages: b}
}

// send posts a chat completion to rank and returns its cached_tokens.
func (h *simHarness) send(rank int, req TokenizeRequest) int {
	h.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": req.Model, "messages": req.Messages, "max_tokens": 3})
	hr, _ := http.NewRequest(http.MethodPost, h.s.URL()+"/v1/chat/completions", bytes.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set(enginesim.RankHeader, strconv.Itoa(rank))
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 {
		h.t.Fatalf("status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		h.t.Fatal(err)
	}
	return out.Usage.Details.Cached
}

// settle waits until every batch the rank published reached the index and
// none followed for a moment.
func (h *simHarness) settle(rank int) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second) // generous: a loaded machine
	stable := 0
	for stable < 3 {
		if time.Now().After(deadline) {
			h.t.Fatalf("rank %d: events not delivered: %+v, published %d", rank,
				h.x.Stats(h.reps[rank]), h.s.Stats()[rank].KVBatches)
		}
		pub := h.s.Stats()[rank].KVBatches
		st := h.x.Stats(h.reps[rank])
		if pub == 0 || (st.Messages > 0 && st.LastSeq+1 == pub) {
			stable++
		} else {
			stable = 0
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// warm sends throwaway requests to rank until its feed is fresh (ZMQ drops
// what a PUB sends before a subscription reaches it; the first message
// received then catches up on the rest from the replay socket).
func (h *simHarness) warm(rank int, model string) {
	h.t.Helper()
	// Bounded in time, not in requests: how many go out before the
	// subscription is up depends on the machine's load.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; !h.x.Fresh(h.reps[rank]); i++ {
		if time.Now().After(deadline) {
			h.t.Fatalf("rank %d: no event received after %d requests", rank, i)
		}
		h.send(rank, chatReq(model, "warm-up "+strconv.Itoa(i), []string{"hi"}))
		time.Sleep(20 * time.Millisecond) // pacing, not synchronisation
	}
	h.settle(rank)
}

// check tokenizes req, predicts rank's cached tokens from the index, sends
// it and compares. It returns the engine's figure.
func (h *simHarness) check(rank int, req TokenizeRequest) int {
	h.t.Helper()
	toks, err := h.tk.Tokenize(context.Background(), h.s.URL(), RequestKey(req), req)
	if err != nil {
		h.t.Fatal(err)
	}
	out := make([]int, h.x.NumReplicas())
	h.x.Overlap(h.x.Keys(nil, 0, toks), out)
	predicted := min(out[h.reps[rank]], (len(toks)-1)/h.bs*h.bs)
	cached := h.send(rank, req)
	if predicted != cached {
		h.t.Fatalf("rank %d: index predicted %d cached tokens of %d, engine reports %d (stats %+v)",
			rank, predicted, len(toks), cached, h.x.Stats(h.reps[rank]))
	}
	h.settle(rank)
	return cached
}

func TestSimulatorEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		enc enginesim.KVEncoding
		h   enginesim.HashEncoding
	}{{enginesim.KVEncodingArray, enginesim.HashUint}, {enginesim.KVEncodingMap, enginesim.HashBytes}} {
		t.Run(fmt.Sprintf("%s/%s", tc.enc, tc.h), func(t *testing.T) {
			h := startSim(t, tc.enc, tc.h)
			model := h.s.Model()
			h.warm(0, model)
			h.warm(1, model)
			for _, r := range h.reps {
				if st := h.x.Stats(r); !st.Complete || !st.Fresh {
					t.Fatalf("replica %d not complete after catching up: %+v", r, st)
				}
			}

			systems := []string{
				strings.Repeat("You are a careful assistant for the billing team. ", 12),
				strings.Repeat("You answer questions about the shipping policy only. ", 10),
			}
			checks, warmHits := 0, 0
			for conv := 0; conv < 6; conv++ {
				sys := systems[conv%2]
				var turns []string
				for turn := 0; turn < 3; turn++ {
					turns = append(turns, fmt.Sprintf("question %d of conversation %d: %s", turn, conv,
						strings.Repeat("details ", 5+turn)))
					rank := (conv + turn) % 2 // both ranks see both prefixes
					if h.check(rank, chatReq(model, sys, turns)) > 0 {
						warmHits++
					}
					checks++
					turns = append(turns, "noted, "+strconv.Itoa(turn))
				}
			}
			if warmHits < checks/2 {
				t.Errorf("only %d of %d checks had cached tokens: the workload checks too little", warmHits, checks)
			}
			if h.x.Removed() == 0 {
				t.Errorf("the engines evicted nothing: the removal path is not checked")
			}
			t.Logf("%d checks, %d with cached tokens; index: %d entries, %d events, %d blocks removed, %d replayed",
				checks, warmHits, h.x.Entries(), h.x.EventsApplied(), h.x.Removed(), h.x.Replayed())

			// An engine restart (sequence numbers start over, cache empty):
			// the replica is fenced on the first new message, then the
			// index follows again.
			h.s.Restart()
			for rank := range h.reps {
				h.send(rank, chatReq(model, "after restart", []string{"hi"}))
			}
			eventually(t, "reset fences", func() bool { return h.x.Fences(FenceReset) >= 2 })
			for rank := range h.reps {
				h.settle(rank)
				if !h.x.Stats(h.reps[rank]).Complete {
					t.Errorf("rank %d not complete after the restart", rank)
				}
				h.check(rank, chatReq(model, systems[0], []string{"again"}))
				if c := h.check(rank, chatReq(model, systems[0], []string{"again", "ok", "more"})); c == 0 {
					t.Errorf("rank %d: no cached tokens after restart", rank)
				}
			}

			// The feed breaks (the engine goes away): both replicas are
			// fenced and reported not fresh, so the router falls back.
			h.s.Close()
			eventually(t, "reconnect fences", func() bool { return h.x.Fences(FenceReconnect) >= 2 })
			for _, r := range h.reps {
				if st := h.x.Stats(r); st.Fresh || st.Complete {
					t.Errorf("replica %d fresh or complete after its feed broke: %+v", r, st)
				}
			}
			if h.x.Entries() != 0 {
				t.Errorf("%d entries left after the feeds broke", h.x.Entries())
			}

			// The engine comes back on the same ports (a new process): the
			// subscriber reconnects, catches up from sequence 0, and the
			// index agrees with the engine again.
			eps := h.s.Options().KVEvents
			s2, err := enginesim.Start(context.Background(), simOptions(tc.enc, tc.h, eps.Endpoint, eps.ReplayEndpoint))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s2.Close() })
			h.s = s2
			h.warm(0, model)
			h.warm(1, model)
			for rank := range h.reps {
				if st := h.x.Stats(h.reps[rank]); !st.Fresh || !st.Complete || !st.Connected {
					t.Errorf("rank %d after the engine came back: %+v", rank, st)
				}
				h.check(rank, chatReq(model, systems[1], []string{"back"}))
				if c := h.check(rank, chatReq(model, systems[1], []string{"back", "ok", "more"})); c == 0 {
					t.Errorf("rank %d: no cached tokens after the engine came back", rank)
				}
			}
		})
	}
}
