package module

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestE2EKVConventions is issue 17's publisher conventions through a real
// Caddy (the policy's Caddyfile, GET /health, the OpenAI SDK), over real
// ZMQ and HTTP on 127.0.0.1, three simulated engines in one fleet:
//
//   - A: ramjet dials its PUB socket; keyed (map) encoding, chain starts
//     with parent 0, sequences from 1, replay replies with a topic frame;
//   - B: ramjet binds, B's PUB connects; positional (array) encoding,
//     parent 0;
//   - C: every store names a parent no block has (an orphan-only feed).
//
// C is flagged within seconds (its /health kv reason), stays usable and is
// routed by the estimate; A and B stay precise, and for every later turn a
// conversation sends to them, the index's overlap before the request
// agrees with the engine's cached_tokens.
func TestE2EKVConventions(t *testing.T) {
	const bs = 16
	start := func(ko enginesim.KVEventsOptions) *enginesim.Server {
		t.Helper()
		sim, err := enginesim.Start(context.Background(), enginesim.Options{
			Instant: true, Engine: engine.Config{BlockSize: bs, CapacityTokens: 1 << 20}, KVEvents: ko})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Close() })
		return sim
	}
	simA := start(enginesim.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		Topic: "kv@a", Encoding: enginesim.KVEncodingMap, ParentZero: true, SeqFromOne: true, ReplayTopic: true})
	simC := start(enginesim.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", OrphanParents: true})
	// B needs the address ramjet binds, known once Caddy runs: a forwarder
	// holds its HTTP address meanwhile.
	fb := newTCPForward(t)
	// A's event path goes through a forwarder that can cut it.
	fe := newTCPForward(t)
	fe.target.Store(strings.TrimPrefix(simA.KVEndpoints()[0], "tcp://"))
	a, b, c := simA.Addr(), fb.addr(), simC.Addr()
	ups := a + " " + b + " " + c
	cd := startCaddyfile(t, `{
	admin {ADMIN}
	auto_https off
	log {
		level ERROR
	}
}
http://{ADDR} {
	handle /health {
		ramjet_health `+ups+`
	}
	handle {
		ramjet_observe
		reverse_proxy `+ups+` {
			lb_policy ramjet {
				kv_events `+a+` dial tcp://`+fe.addr()+` `+simA.KVReplayEndpoints()[0]+` {
					topic kv@a
				}
				kv_events `+b+` bind tcp://127.0.0.1:0 {
					topic kv@b
				}
				kv_events `+c+` `+simC.KVEndpoints()[0]+`
				kv_block_size 16
				tokenize {
					timeout 2s
					wait always
				}
			}
		}
	}
}
`)
	k := liveKV(t)
	var bound string
	eventually(t, "ramjet bound B's event socket", func() bool {
		bound = k.p.Subscriber().BoundAddr("tcp://127.0.0.1:0")
		return bound != ""
	})
	simB := start(enginesim.KVEventsOptions{Endpoint: bound, Connect: true, Topic: "kv@b", ParentZero: true})
	fb.target.Store(simB.Addr())
	model := simA.Model()
	ra, _ := k.p.Index().Lookup(a)
	rb, _ := k.p.Index().Lookup(b)
	rc, _ := k.p.Index().Lookup(c)

	// direct sends a fresh prompt straight to an engine (not through the
	// router, which may prefer another), to make it publish.
	i := 0
	direct := func(sim *enginesim.Server) {
		t.Helper()
		msgs, _ := json.Marshal([]map[string]string{{"role": "user", "content": longText(fmt.Sprintf("direct %d", i), 600)}})
		i++
		engineCached(t, sim.URL(), model, msgs)
	}
	eventually(t, "A's and B's feeds fresh", func() bool {
		direct(simA)
		direct(simB)
		return k.p.Index().Fresh(ra) && k.p.Index().Fresh(rb)
	})
	// C's stores never land: flagged within seconds of its first.
	began := time.Now()
	eventually(t, "C's feed flagged", func() bool {
		direct(simC)
		st := k.p.Index().Stats(rc)
		return st.Messages > 0 && !st.Healthy
	})
	took := time.Since(began)
	if took > 10*time.Second {
		t.Errorf("C's orphan feed flagged after %v, want within seconds", took)
	}

	rep := cd.healthOf()
	if len(rep.Replicas) != 3 {
		t.Fatalf("/health: %+v", rep)
	}
	for i, r := range rep.Replicas[:2] {
		if r.KV == nil || !r.KV.Healthy || r.KV.Reason != "" || !r.Healthy {
			t.Errorf("replica %d (%s) in /health: %+v, kv %+v; want usable, its feed healthy", i, []string{"A", "B"}[i], r, r.KV)
		}
	}
	if r := rep.Replicas[2]; r.KV == nil || r.KV.Healthy || !strings.HasPrefix(r.KV.Reason, "stores_not_landing: ") || !r.Healthy {
		t.Errorf("C in /health: %+v, kv %+v (want usable, its feed unhealthy with the reason)", r, r.KV)
	}
	if st := k.p.Index().Stats(rc); st.Fresh || st.Entries != 0 || st.Orphans == 0 {
		t.Errorf("C's feed: %+v (want not fresh, nothing indexed, orphans counted)", st)
	}
	if st := k.p.Index().Stats(ra); !st.Complete || st.Orphans != 0 || st.DecodeErrors != 0 {
		t.Errorf("A's feed (dial, replayable) does not mirror the engine: %+v", st)
	}
	if st := k.p.Index().Stats(rb); st.Orphans != 0 || st.DecodeErrors != 0 {
		t.Errorf("B's feed: %+v", st)
	}
	byID := map[string]kvindex.Replica{rep.Replicas[0].ID: ra, rep.Replicas[1].ID: rb, rep.Replicas[2].ID: rc}
	name := map[kvindex.Replica]string{ra: "A", rb: "B", rc: "C"}

	// Conversations of three turns through Caddy, each with its own system
	// prompt so that cold placement spreads them. Before each request the
	// index's overlap of its tokens is read for every replica; on A and B
	// it must equal the cached_tokens the engine reports.
	before := k.preciseN()
	checked, hits := map[string]int{}, map[string]int{}
	onC := 0
	client := newClient(cd)
	// Until A and B each served a few later turns (where a conversation
	// starts is the router's choice).
	const turns = 3
	conv := 0
	for ; checked["A"] < 3 || checked["B"] < 3; conv++ {
		if conv == 60 {
			t.Fatalf("after %d conversations, later turns checked %v (want 3 on A and B)", conv, checked)
		}
		system := longText(fmt.Sprintf("conventions %d", conv), 2000)
		sdk := []openai.ChatCompletionMessageParamUnion{systemMsg(system)}
		raw := []map[string]string{{"role": "system", "content": system}}
		for turn := range turns {
			u := longText(fmt.Sprintf("conv %d turn %d", conv, turn), 300)
			sdk = append(sdk, userMsg(u))
			raw = append(raw, map[string]string{"role": "user", "content": u})
			msgs, _ := json.Marshal(raw)
			toks, err := k.p.Tokenize(context.Background(), uint64(1_000_000+conv*turns+turn), kvindex.TokenizeRequest{Model: model, Messages: msgs})
			if err != nil {
				t.Fatal(err)
			}
			out := make([]int, k.p.Index().NumReplicas())
			k.p.Index().Overlap(k.p.Index().Keys(nil, 0, toks), out)
			id, cached := kvChat(t, client, model, sdk)
			r, ok := byID[id]
			if !ok {
				t.Fatalf("upstream %q not among /health's ids", id)
			}
			if r == rc {
				onC++
			} else if int(cached) != out[r] {
				t.Errorf("conv %d turn %d on %s: engine cached %d, index %d", conv, turn, name[r], cached, out[r])
			} else if turn > 0 {
				checked[name[r]]++
				if cached > 0 {
					hits[name[r]]++
				}
			}
			if r != rc {
				// The next turn's overlap is read once this request's
				// blocks are indexed (the engine's stores arrive over ZMQ
				// after its response).
				eventually(t, "the request's blocks indexed", func() bool {
					k.p.Index().Overlap(k.p.Index().Keys(nil, 0, toks), out)
					return out[r] == len(toks)/bs*bs
				})
			}
			sdk = append(sdk, openai.AssistantMessage("noted"))
			raw = append(raw, map[string]string{"role": "assistant", "content": "noted"})
		}
	}
	if got := k.preciseN() - before; got != uint64(conv*turns) {
		t.Errorf("%d of %d decisions were precise", got, conv*turns)
	}
	for _, e := range []string{"A", "B"} {
		if checked[e] == 0 || hits[e] != checked[e] {
			t.Errorf("engine %s: %d of %d later turns agreed with a cached prefix", e, hits[e], checked[e])
		}
	}

	// C is still routed by the estimate (its feed is not trusted), A and B
	// by the exact overlap.
	toks, err := k.p.Tokenize(context.Background(), 2_000_000, kvindex.TokenizeRequest{Model: model,
		Messages: []byte(`[{"role":"user","content":"which replicas are precise?"}]`)})
	if err != nil {
		t.Fatal(err)
	}
	cands := make([]selection.Candidate, 3)
	k.p.Index().Annotate(k.p.Index().Keys(nil, 0, toks), []kvindex.Replica{ra, rb, rc}, cands, make([]int, k.p.Index().NumReplicas()))
	if !cands[0].Precise || !cands[1].Precise || cands[2].Precise {
		t.Errorf("annotation %+v: want A and B precise, C by the estimate", cands)
	}

	// A reconnect replays what was missed: A's event path is cut while A
	// stores a conversation, then restored; the gap is noticed and filled
	// from A's replay socket, and the index agrees with A's cached_tokens
	// on the conversation's next turn.
	// chatA sends msgs straight to A (the router's load term may prefer
	// another replica for the next turn) and returns its cached_tokens.
	chatA := func(msgs []map[string]string) int {
		t.Helper()
		b, _ := json.Marshal(msgs)
		return engineCached(t, simA.URL(), model, b)
	}
	prev := k.p.Index().Stats(ra)
	fe.cut()
	system := longText("stored while A's feed was cut", 2000)
	missed := []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": "first question"}}
	chatA(missed)
	missedMsgs, _ := json.Marshal(missed)
	missedToks, err := k.p.Tokenize(context.Background(), 3_000_000, kvindex.TokenizeRequest{Model: model, Messages: missedMsgs})
	if err != nil {
		t.Fatal(err)
	}
	fe.target.Store(strings.TrimPrefix(simA.KVEndpoints()[0], "tcp://"))
	out := make([]int, k.p.Index().NumReplicas())
	eventually(t, "the stores A made while cut off replayed", func() bool {
		direct(simA) // makes A publish once the path is back
		k.p.Index().Overlap(k.p.Index().Keys(nil, 0, missedToks), out)
		// (Replayed counts a replay once its last message is applied.)
		return k.p.Index().Fresh(ra) && out[ra] == len(missedToks)/bs*bs && k.p.Index().Stats(ra).Replayed > prev.Replayed
	})
	if st := k.p.Index().Stats(ra); st.Fences <= prev.Fences || st.Replayed <= prev.Replayed || st.ReplayFailures != 0 {
		t.Errorf("A after the cut: fences %d (before %d), replayed %d (before %d), replay failures %d",
			st.Fences, prev.Fences, st.Replayed, prev.Replayed, st.ReplayFailures)
	}
	missed = append(missed, map[string]string{"role": "assistant", "content": "noted"}, map[string]string{"role": "user", "content": "second question"})
	missedMsgs, _ = json.Marshal(missed)
	toks, err = k.p.Tokenize(context.Background(), 3_000_001, kvindex.TokenizeRequest{Model: model, Messages: missedMsgs})
	if err != nil {
		t.Fatal(err)
	}
	k.p.Index().Overlap(k.p.Index().Keys(nil, 0, toks), out)
	if cached := chatA(missed); cached != out[ra] || cached < len(missedToks)/bs*bs {
		t.Errorf("the missed conversation's next turn on A: engine cached %d, index %d (the missed prompt's blocks: %d)",
			cached, out[ra], len(missedToks)/bs*bs)
	}
	t.Logf("A's feed after the cut: %+v", k.p.Index().Stats(ra))
	t.Logf("later turns agreeing: %v of %v; requests on C %d; C flagged after %v: %+v", hits, checked, onC, took, k.p.Index().Stats(rc))
}

// engineCached sends a chat of msgs (a JSON array) straight to the engine
// at url and returns the prompt's cached_tokens.
func engineCached(t *testing.T, url, model string, msgs []byte) int {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":%s}`, model, msgs)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("engine %s: %s: %v", url, resp.Status, err)
	}
	return cachedTokens(t, b) // snapshot_test.go
}
