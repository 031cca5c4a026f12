package module

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// The end-to-end tests run a real Caddy in-process, in front of engine
// simulators on 127.0.0.1, and talk to it with the official OpenAI SDK.

func newClient(c *testCaddy) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(c.url("/v1/")),
		option.WithAPIKey("test"),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second),
	)
}

func userMsg(s string) openai.ChatCompletionMessageParamUnion   { return openai.UserMessage(s) }
func systemMsg(s string) openai.ChatCompletionMessageParamUnion { return openai.SystemMessage(s) }

// reply is what one chat completion tells a test.
type reply struct {
	routeID string
	engine  int   // index of the simulator that served it
	cached  int64 // usage.prompt_tokens_details.cached_tokens
	text    string
}

// chat sends a non-streaming chat completion.
func chat(t *testing.T, cl openai.Client, ss sims, msgs []openai.ChatCompletionMessageParamUnion) reply {
	t.Helper()
	var resp *http.Response
	out, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     "qwen3-8b",
		Messages:  msgs,
		MaxTokens: openai.Int(4),
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	id := resp.Header.Get(HeaderUpstream)
	if len(id) != 16 {
		t.Fatalf("X-Ramjet-Upstream = %q, want 16 hex chars", id)
	}
	r := reply{routeID: id, engine: ss.byRouteID(id), cached: out.Usage.PromptTokensDetails.CachedTokens}
	if len(out.Choices) > 0 {
		r.text = out.Choices[0].Message.Content
	}
	if r.engine < 0 && len(ss) > 0 {
		t.Fatalf("route id %s names no engine", id)
	}
	return r
}

func TestE2EConversationStaysOnReplica(t *testing.T) {
	ss := startSims(t, 8, enginesim.Options{})
	c := startCaddy(t, ss.dials(), proxyOpts{})
	cl := newClient(c)

	msgs := []openai.ChatCompletionMessageParamUnion{systemMsg(longText("conversation", 4096))}
	var first reply
	for turn := range 6 {
		msgs = append(msgs, userMsg(longText("question "+itoa(turn), 600)))
		r := chat(t, cl, ss, msgs)
		if turn == 0 {
			first = r
		} else {
			if r.engine != first.engine || r.routeID != first.routeID {
				t.Fatalf("turn %d went to engine %d, turn 0 to %d", turn, r.engine, first.engine)
			}
			if r.cached == 0 {
				t.Fatalf("turn %d: no cached prompt tokens on the engine", turn)
			}
		}
		msgs = append(msgs, openai.AssistantMessage(r.text))
	}
	if got := ss.requests()[first.engine]; got != 6 {
		t.Fatalf("engine %d received %d requests, want 6", first.engine, got)
	}
}

func TestE2ESharedSystemPromptLandsTogether(t *testing.T) {
	ss := startSims(t, 8, enginesim.Options{})
	c := startCaddy(t, ss.dials(), proxyOpts{})
	cl := newClient(c)
	sys := systemMsg(longText("shared agent instructions", 16384))

	// Independent conversations sharing only the system prompt, one at a
	// time (low load): all join the first one's replica and hit its cache.
	var first reply
	for i := range 5 {
		r := chat(t, cl, ss, []openai.ChatCompletionMessageParamUnion{sys, userMsg(longText("user "+itoa(i), 300))})
		if i == 0 {
			first = r
			continue
		}
		if r.engine != first.engine {
			t.Fatalf("conversation %d went to engine %d, conversation 0 to %d", i, r.engine, first.engine)
		}
		if r.cached < 3000 {
			t.Fatalf("conversation %d: %d cached prompt tokens, want the shared system prompt's", i, r.cached)
		}
	}
}

func TestE2EBurstSpreads(t *testing.T) {
	// Real time: a 32 KiB prompt takes the simulated engine about a second
	// to prefill, so the 12 requests are all in flight together.
	ss := startSims(t, 8, enginesim.Options{TimeScale: 1})
	c := startCaddy(t, ss.dials(), proxyOpts{})
	cl := newClient(c)
	sys := longText("burst prefix", 32768)
	const n = 12
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			var resp *http.Response
			_, errs[i] = cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:     "qwen3-8b",
				Messages:  []openai.ChatCompletionMessageParamUnion{systemMsg(sys), userMsg("task " + itoa(i))},
				MaxTokens: openai.Int(2),
			}, option.WithResponseInto(&resp))
			if resp != nil {
				ids[i] = resp.Header.Get(HeaderUpstream)
			}
		})
	}
	wg.Wait()
	spread := map[int]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		spread[ss.byRouteID(ids[i])]++
	}
	if len(spread) < 7 {
		t.Fatalf("burst of %d landed on %d engines (%v), want >= 7", n, len(spread), spread)
	}
	if got := ss.requests(); sum(got) != n {
		t.Fatalf("engines received %v requests, want %d in all", got, n)
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

func TestE2EBodyByteForByte(t *testing.T) {
	ss := startSims(t, 4, enginesim.Options{})
	for _, withMatcher := range []bool{false, true} {
		name := "policy"
		o := proxyOpts{}
		if withMatcher {
			name = "matcher"
			o.Matcher = []string{"qwen3-*"}
		}
		t.Run(name, func(t *testing.T) {
			c := startCaddy(t, ss.dials(), o)
			// Odd whitespace, escapes, unicode, key order, a big content.
			body := "{ \"messages\" : [ {\"content\":\"h\\u00e9llo \\\"w\\\"\\n" + longText("x", 120000) +
				"\", \"role\":\"user\"} ],\n\t\"model\":\"qwen3-8b\", \"max_tokens\": 2, \"temperature\": 0.70 }  "
			resp, b := c.post("/v1/chat/completions", body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			e := ss.byRouteID(resp.Header.Get(HeaderUpstream))
			if e < 0 {
				t.Fatalf("unknown route id %q", resp.Header.Get(HeaderUpstream))
			}
			rec, ok := ss[e].LastRequest()
			if !ok {
				t.Fatal("engine recorded no request")
			}
			if string(rec.Body) != body {
				t.Fatalf("upstream got %d bytes, sent %d", len(rec.Body), len(body))
			}
			if cl := rec.Header.Get("Content-Length"); cl != itoa(len(body)) {
				t.Fatalf("upstream Content-Length %q, want %d", cl, len(body))
			}
		})
	}
}

func TestE2EStreamingUnbuffered(t *testing.T) {
	// Real time: 60 output tokens take the simulated engine over a second.
	ss := startSims(t, 2, enginesim.Options{TimeScale: 1})
	c := startCaddy(t, ss.dials(), proxyOpts{})
	cl := newClient(c)
	start := time.Now()
	stream := cl.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:     "qwen3-8b",
		Messages:  []openai.ChatCompletionMessageParamUnion{userMsg("stream please")},
		MaxTokens: openai.Int(60),
	})
	defer stream.Close()
	var firstAt time.Duration
	chunks := 0
	for stream.Next() {
		if len(stream.Current().Choices) > 0 && stream.Current().Choices[0].Delta.Content != "" {
			if chunks == 0 {
				firstAt = time.Since(start)
				if busy := ss.busy(); busy != 1 {
					t.Fatalf("first chunk arrived after the engine finished (busy=%d)", busy)
				}
			}
			chunks++
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	total := time.Since(start)
	if chunks < 10 {
		t.Fatalf("got %d content chunks", chunks)
	}
	if firstAt > total/2 {
		t.Fatalf("first chunk at %v of %v: the stream was buffered", firstAt, total)
	}
}

func TestE2EClientDisconnectCancelsAndReleases(t *testing.T) {
	ss := startSims(t, 4, enginesim.Options{TimeScale: 1})
	c := startCaddy(t, ss.dials(), proxyOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"model":"qwen3-8b","stream":true,"max_tokens":20000,"messages":[{"role":"user","content":"` +
		longText("disconnect", 4000) + `"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/v1/chat/completions"), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	f := lookupFleet("")
	if in := totalInflight(f); in != 1 {
		t.Fatalf("in flight while streaming = %d, want 1", in)
	}
	if p := totalPending(f); p != 0 {
		t.Fatalf("pending prefill after the first token = %d, want 0", p)
	}
	if ss.busy() != 1 {
		t.Fatalf("engine busy = %d, want 1", ss.busy())
	}
	cancel()
	resp.Body.Close()

	// 20000 tokens would take minutes: only a cancellation ends it now.
	eventually(t, "upstream request canceled", func() bool { return ss.busy() == 0 })
	eventually(t, "reservation released", func() bool { return totalInflight(f) == 0 && totalPending(f) == 0 })
}

func totalInflight(f *fleet) int64 {
	var n int64
	for _, r := range f.replicas() {
		n += r.Inflight
	}
	return n
}

func totalPending(f *fleet) int64 {
	var n int64
	for _, r := range f.replicas() {
		n += r.PendingPrefill
	}
	return n
}

func TestE2EUnhealthySkipped(t *testing.T) {
	ss := startSims(t, 4, enginesim.Options{})
	c := startCaddy(t, ss.dials(), proxyOpts{Health: true})
	cl := newClient(c)
	sys := systemMsg(longText("health", 8192))
	warm := chat(t, cl, ss, []openai.ChatCompletionMessageParamUnion{sys, userMsg("one")})

	// The replica holding the conversation's cache goes down.
	down := ss[warm.engine]
	if err := down.SetFaults(enginesim.Faults{RefuseConnections: true}); err != nil {
		t.Fatal(err)
	}
	f := lookupFleet("")
	eventually(t, "engine marked unhealthy", func() bool {
		for _, r := range f.replicas() {
			if r.Key == down.Addr() {
				return r.Known && !r.Healthy
			}
		}
		return false
	})
	before := ss.requests()[warm.engine]
	var next int = -1
	for i := range 6 {
		r := chat(t, cl, ss, []openai.ChatCompletionMessageParamUnion{sys, userMsg("turn " + itoa(i))})
		if r.engine == warm.engine {
			t.Fatalf("request %d went to the unhealthy engine %d", i, warm.engine)
		}
		if next >= 0 && r.engine != next {
			t.Fatalf("request %d went to engine %d, the conversation had moved to %d", i, r.engine, next)
		}
		next = r.engine
	}
	if got := ss.requests()[warm.engine]; got != before {
		t.Fatalf("unhealthy engine received %d requests", got-before)
	}
}

func TestE2EStateSurvivesReload(t *testing.T) {
	ss := startSims(t, 8, enginesim.Options{})
	c := startCaddy(t, ss.dials(), proxyOpts{Tag: "one"})
	cl := newClient(c)
	msgs := []openai.ChatCompletionMessageParamUnion{systemMsg(longText("reload", 8192)), userMsg("first")}
	first := chat(t, cl, ss, msgs)
	f := lookupFleet("")
	entries := f.Base().Index().Entries()
	if entries == 0 {
		t.Fatal("index empty after a routed request")
	}

	c.reload(proxyOpts{Tag: "two"}) // admin POST /load
	resp, _ := c.post("/v1/models", "")
	if resp.Header.Get("X-Test-Config") != "two" {
		t.Fatal("reload did not take effect")
	}
	if g := lookupFleet(""); g != f {
		t.Fatal("reload replaced the fleet state")
	}
	if got := f.Base().Index().Entries(); got < entries {
		t.Fatalf("index shrank across reload: %d -> %d", entries, got)
	}
	msgs = append(msgs, openai.AssistantMessage(first.text), userMsg("second"))
	second := chat(t, cl, ss, msgs)
	if second.engine != first.engine || second.routeID != first.routeID {
		t.Fatalf("after reload the conversation moved from engine %d to %d", first.engine, second.engine)
	}

	// A change of a knob the index does not depend on retunes the same
	// state: the conversation still finds its replica.
	c.reload(proxyOpts{Tag: "tuned", Policy: map[string]any{"alpha": 0.5, "affinity_cap": 100000}})
	if g := lookupFleet(""); g != f {
		t.Fatal("an alpha/affinity_cap change replaced the fleet state")
	}
	if got := f.Router().Config(); got.Alpha != 0.5 || got.AffinityCap != 100000 {
		t.Fatalf("knobs not retuned: alpha %v cap %d", got.Alpha, got.AffinityCap)
	}
	msgs = append(msgs, openai.AssistantMessage(second.text), userMsg("third"))
	third := chat(t, cl, ss, msgs)
	if third.engine != first.engine {
		t.Fatalf("after a retune the conversation moved from engine %d to %d", first.engine, third.engine)
	}

	// A change of an index-relevant setting starts a new Router.
	c.reload(proxyOpts{Tag: "three", Policy: map[string]any{"block_tokens": 32}})
	if g := lookupFleet(""); g == f || g == nil {
		t.Fatal("block_tokens change kept the old index")
	}
}

func TestE2EFallbackWithoutBody(t *testing.T) {
	ss := startSims(t, 4, enginesim.Options{})
	c := startCaddy(t, ss.dials(), proxyOpts{})
	resp, err := http.Get(c.url("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || ss.byRouteID(resp.Header.Get(HeaderUpstream)) < 0 {
		t.Fatalf("GET /v1/models: %d, route id %q", resp.StatusCode, resp.Header.Get(HeaderUpstream))
	}
	eventually(t, "fallback reservation released", func() bool { return totalInflight(lookupFleet("")) == 0 })
}

func TestE2EDataParallelRanks(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{DP: 4})
	addr := ss[0].Addr()
	c := startCaddy(t, []string{addr, addr, addr, addr}, proxyOpts{})
	cl := newClient(c)
	f := lookupFleet("")
	seen := map[int]bool{}
	for i := range 12 {
		sys := systemMsg(longText("rank conversation "+itoa(i), 4096))
		r := chat(t, cl, nil, []openai.ChatCompletionMessageParamUnion{sys, userMsg("hi")})
		rec, ok := ss[0].LastRequest()
		if !ok {
			t.Fatal("no request recorded")
		}
		h := rec.Header.Get(HeaderRank)
		if h == "" || f.RouteID(addr+"#"+h) != r.routeID || rec.Rank != atoi(t, h) {
			t.Fatalf("rank header %q, engine rank %d, route id %s", h, rec.Rank, r.routeID)
		}
		seen[rec.Rank] = true
	}
	if len(seen) < 2 {
		t.Fatalf("12 cold conversations used ranks %v", seen)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestE2ERetryReplaysBody(t *testing.T) {
	for _, withMatcher := range []bool{false, true} {
		name := "policy"
		o := proxyOpts{Retries: 2, NoKeepAlive: true}
		if withMatcher {
			name = "matcher"
			o.Matcher = []string{"qwen3-*"}
		}
		t.Run(name, func(t *testing.T) {
			ss := startSims(t, 4, enginesim.Options{})
			c := startCaddy(t, ss.dials(), o)
			cl := newClient(c)
			sys := systemMsg(longText("retry", 8192))
			warm := chat(t, cl, ss, []openai.ChatCompletionMessageParamUnion{sys, userMsg("one")})

			// The warm replica refuses connections, but no health check
			// noticed yet: ramjet picks it, the dial fails, Caddy retries
			// and ramjet picks another replica with the same body.
			if err := ss[warm.engine].SetFaults(enginesim.Faults{RefuseConnections: true}); err != nil {
				t.Fatal(err)
			}
			body := `{"model":"qwen3-8b","max_tokens":2,"messages":[{"role":"system","content":"` +
				longText("retry", 8192) + `"},{"role":"user","content":"two \u00e9"}]}`
			resp, b := c.post("/v1/chat/completions", body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			e := ss.byRouteID(resp.Header.Get(HeaderUpstream))
			if e < 0 || e == warm.engine {
				t.Fatalf("retried request served by engine %d (warm, refusing: %d)", e, warm.engine)
			}
			rec, _ := ss[e].LastRequest()
			if string(rec.Body) != body {
				t.Fatalf("retried upstream got %d bytes, sent %d", len(rec.Body), len(body))
			}
			f := lookupFleet("")
			eventually(t, "both attempts' reservations released", func() bool {
				return totalInflight(f) == 0 && totalPending(f) == 0
			})
		})
	}
}

func TestE2ECaddyfileModels(t *testing.T) {
	qwen := startSims(t, 2, enginesim.Options{Model: "qwen3-8b"})
	llama := startSims(t, 2, enginesim.Options{Model: "llama-3.1-8b"})
	c := startCaddyfile(t, `{
	admin {ADMIN}
	auto_https off
	log {
		level ERROR
	}
}

http://{ADDR} {
	@qwen ramjet_body qwen3-*
	handle @qwen {
		ramjet_observe
		reverse_proxy `+strings.Join(qwen.dials(), " ")+` {
			lb_policy ramjet {
				state_key qwen
			}
			flush_interval -1
		}
	}

	@llama ramjet_body {
		model llama-3.*
	}
	handle @llama {
		ramjet_observe
		reverse_proxy `+strings.Join(llama.dials(), " ")+` {
			lb_policy ramjet {
				state_key llama
			}
			flush_interval -1
		}
	}

	handle {
		respond "no such model" 404
	}
}
`)
	fq, fl := lookupFleet("qwen"), lookupFleet("llama")
	if fq == nil || fl == nil || fq == fl {
		t.Fatalf("fleets qwen %p llama %p", fq, fl)
	}
	in := func(f *fleet, ss sims, id string) bool {
		for _, s := range ss {
			if f.RouteID(s.Addr()) == id {
				return true
			}
		}
		return false
	}
	for i := range 4 {
		for _, tc := range []struct {
			model string
			f     *fleet
			ss    sims
		}{{"qwen3-8b", fq, qwen}, {"llama-3.1-8b", fl, llama}} {
			resp, b := c.post("/v1/chat/completions", chatBody(tc.model, false, [2]string{"user", "hello " + itoa(i)}))
			if resp.StatusCode != 200 {
				t.Fatalf("%s: status %d: %s", tc.model, resp.StatusCode, b)
			}
			if id := resp.Header.Get(HeaderUpstream); !in(tc.f, tc.ss, id) {
				t.Fatalf("%s: served by %q, not one of its pool", tc.model, id)
			}
		}
	}
	for _, body := range []string{
		chatBody("mistral-7b", false, [2]string{"user", "hi"}),
		`{"model":"qwen3-8b","messages":[`, // malformed: no match
	} {
		resp, b := c.post("/v1/chat/completions", body)
		if resp.StatusCode != 404 || string(b) != "no such model" {
			t.Fatalf("%.30s: status %d %q, want the 404 route", body, resp.StatusCode, b)
		}
	}
}

func TestE2ERankHeaderOnRetry(t *testing.T) {
	// Engine A has two data-parallel ranks (listed twice), engine B one
	// (listed once, no rank header). header_up makes Caddy rebuild the
	// request headers from the first attempt's on every attempt.
	ranked := startSims(t, 1, enginesim.Options{DP: 2})
	plain := startSims(t, 1, enginesim.Options{})
	a, b := ranked[0].Addr(), plain[0].Addr()
	c := startCaddy(t, []string{a, a, b}, proxyOpts{Retries: 2, HeaderUp: true})
	cl := newClient(c)
	f := lookupFleet("")
	send := func(sys, user string) string {
		t.Helper()
		var resp *http.Response
		if _, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model:     "qwen3-8b",
			Messages:  []openai.ChatCompletionMessageParamUnion{systemMsg(sys), userMsg(user)},
			MaxTokens: openai.Int(2),
		}, option.WithResponseInto(&resp)); err != nil {
			t.Fatal(err)
		}
		return resp.Header.Get(HeaderUpstream)
	}
	// Find a conversation that lands on a rank of A.
	sys := ""
	for i := range 20 {
		s := longText("rank retry "+itoa(i), 8192)
		if id := send(s, "one"); id != f.RouteID(b) {
			sys = s
			break
		}
	}
	if sys == "" {
		t.Fatal("no conversation landed on the ranked engine")
	}
	// A refuses connections: ramjet picks its warm rank, the dial fails,
	// the retry goes to B, which must not receive A's rank header.
	if err := ranked[0].SetFaults(enginesim.Faults{RefuseConnections: true}); err != nil {
		t.Fatal(err)
	}
	before := plain.requests()[0]
	if id := send(sys, "two"); id != f.RouteID(b) {
		t.Fatalf("retry served by %s, want engine B %s", id, f.RouteID(b))
	}
	rec, ok := plain[0].LastRequest()
	if !ok || plain.requests()[0] != before+1 {
		t.Fatal("the retry did not reach engine B")
	}
	if h, ok := rec.Header[http.CanonicalHeaderKey(HeaderRank)]; ok || rec.Header.Get("X-Test-Up") != "1" {
		t.Fatalf("retry to an unranked engine carried %s %q (X-Test-Up %q)", HeaderRank, h, rec.Header.Get("X-Test-Up"))
	}
}

// TestE2ENoLeakedReservations drives concurrent streaming and plain
// requests, a third of them abandoned by the client at a random point,
// and checks that every reservation is released at the end.
func TestE2ENoLeakedReservations(t *testing.T) {
	ss := startSims(t, 4, enginesim.Options{TimeScale: 50})
	c := startCaddy(t, ss.dials(), proxyOpts{})
	f := lookupFleet("")
	const n, workers = 96, 12
	jobs := make(chan int)
	var wg sync.WaitGroup
	var failed sync.Map
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				ctx, cancel := context.WithCancel(context.Background())
				stream := i%2 == 0
				body := chatBody("qwen3-8b", stream, [2]string{"system", longText("soak "+itoa(i%5), 2048)}, [2]string{"user", "q " + itoa(i)})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/v1/chat/completions"), strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if i%3 == 0 {
					// Abandon after a delay that lands before, during or
					// after the response.
					time.AfterFunc(time.Duration(i%7)*3*time.Millisecond, cancel)
				}
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						failed.Store(i, resp.Status)
					}
				}
				if err != nil && i%3 != 0 {
					failed.Store(i, err.Error())
				}
				cancel()
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	failed.Range(func(k, v any) bool {
		t.Errorf("request %v: %v", k, v)
		return true
	})
	eventually(t, "every reservation released", func() bool { return totalInflight(f) == 0 && totalPending(f) == 0 })
	eventually(t, "engines idle", func() bool { return ss.busy() == 0 })
}
