package module

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func newClient(c *testCaddy) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(c.url("/v1/")),
		option.WithAPIKey("test"),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(20*time.Second),
	)
}

func userMsg(s string) openai.ChatCompletionMessageParamUnion   { return openai.UserMessage(s) }
func systemMsg(s string) openai.ChatCompletionMessageParamUnion { return openai.SystemMessage(s) }

// chat sends a non-streaming chat completion and returns the route id and
// the engine that answered.
func chat(t *testing.T, cl openai.Client, msgs []openai.ChatCompletionMessageParamUnion) (string, string) {
	t.Helper()
	var resp *http.Response
	_, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "qwen3-8b",
		Messages: msgs,
	}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	id := resp.Header.Get(HeaderUpstream)
	if len(id) != 16 {
		t.Fatalf("X-Ramjet-Upstream = %q, want 16 hex chars", id)
	}
	return id, resp.Header.Get("X-Engine")
}

func TestE2EConversationStaysOnReplica(t *testing.T) {
	es := startEngines(t, 8)
	c := startCaddy(t, dials(es), proxyOpts{})
	cl := newClient(c)

	msgs := []openai.ChatCompletionMessageParamUnion{systemMsg(longText("conversation", 4096))}
	var first string
	for turn := range 6 {
		msgs = append(msgs, userMsg(longText("question "+string(rune('a'+turn)), 600)))
		_, eng := chat(t, cl, msgs)
		if turn == 0 {
			first = eng
		} else if eng != first {
			t.Fatalf("turn %d went to engine %s, turn 0 to %s", turn, eng, first)
		}
		msgs = append(msgs, openai.AssistantMessage("answer from engine "+eng))
	}
}

func TestE2ESharedSystemPromptLandsTogether(t *testing.T) {
	es := startEngines(t, 8)
	c := startCaddy(t, dials(es), proxyOpts{})
	cl := newClient(c)
	sys := systemMsg(longText("shared agent instructions", 16384))

	// Several independent conversations sharing only the system prompt,
	// one at a time (low load): all join the first one's replica.
	var first string
	for i := range 5 {
		_, eng := chat(t, cl, []openai.ChatCompletionMessageParamUnion{sys,
			userMsg(longText("user "+string(rune('a'+i)), 300))})
		if i == 0 {
			first = eng
		} else if eng != first {
			t.Fatalf("conversation %d went to engine %s, conversation 0 to %s", i, eng, first)
		}
	}
}

func TestE2EBurstSpreads(t *testing.T) {
	es := startEngines(t, 8)
	c := startCaddy(t, dials(es), proxyOpts{})
	cl := newClient(c)
	// Every engine holds its requests before the first byte (a prefill)
	// until all 12 have arrived, so all 12 are in flight at once.
	gate := make(chan struct{})
	for _, e := range es {
		e.gate.Store(&gate)
	}
	sys := longText("burst prefix", 32768)
	const n = 12
	var wg sync.WaitGroup
	engines := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			var resp *http.Response
			_, errs[i] = cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:    "qwen3-8b",
				Messages: []openai.ChatCompletionMessageParamUnion{systemMsg(sys), userMsg("task " + string(rune('a'+i)))},
			}, option.WithResponseInto(&resp))
			if resp != nil {
				engines[i] = resp.Header.Get("X-Engine")
			}
		})
	}
	waitArrivals(t, es, n)
	close(gate)
	wg.Wait()
	spread := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		spread[engines[i]]++
	}
	if len(spread) < 7 {
		t.Fatalf("burst of %d landed on %d engines (%v), want >= 7", n, len(spread), spread)
	}
}

// waitArrivals waits until n requests reached the engines in total.
func waitArrivals(t *testing.T, es []*testEngine, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		total := 0
		for _, e := range es {
			total += int(e.active.Load())
		}
		if total >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("fewer than %d requests arrived", n)
}

func TestE2EBodyByteForByte(t *testing.T) {
	es := startEngines(t, 4)
	for _, withMatcher := range []bool{false, true} {
		name := "policy"
		o := proxyOpts{}
		if withMatcher {
			name = "matcher"
			o.Matcher = []string{"qwen3-*"}
		}
		t.Run(name, func(t *testing.T) {
			c := startCaddy(t, dials(es), o)
			// Odd whitespace, escapes, unicode, key order, a big content.
			body := "{ \"messages\" : [ {\"content\":\"h\\u00e9llo \\\"w\\\"\\n" + longText("x", 200000) +
				"\", \"role\":\"user\"} ],\n\t\"model\":\"qwen3-8b\", \"temperature\": 0.70 }  "
			resp, _ := c.post("/v1/chat/completions", body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			eng := resp.Header.Get("X-Engine")
			var got []byte
			var hdr http.Header
			for _, e := range es {
				if eng == itoa(e.id) {
					got, hdr = e.lastBody()
				}
			}
			if string(got) != body {
				t.Fatalf("upstream got %d bytes, sent %d (equal prefix %v)", len(got), len(body), strings.HasPrefix(body, string(got)))
			}
			if cl := hdr.Get("Content-Length"); cl != itoa(len(body)) {
				t.Fatalf("upstream Content-Length %q, want %d", cl, len(body))
			}
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestE2EStreamingUnbuffered(t *testing.T) {
	es := startEngines(t, 4)
	c := startCaddy(t, dials(es), proxyOpts{})
	cl := newClient(c)
	hold := make(chan struct{})
	for _, e := range es {
		e.hold.Store(&hold)
	}
	stream := cl.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:    "qwen3-8b",
		Messages: []openai.ChatCompletionMessageParamUnion{userMsg(longText("stream", 2000))},
	})
	defer stream.Close()
	got := make(chan string, 1)
	go func() {
		if stream.Next() {
			got <- stream.Current().Choices[0].Delta.Content
		} else {
			got <- "error: " + errString(stream.Err())
		}
	}()
	select {
	case s := <-got:
		if !strings.HasPrefix(s, "engine ") {
			t.Fatalf("first chunk %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first SSE chunk not delivered while the upstream holds the stream open")
	}
	close(hold)
	n := 0
	for stream.Next() {
		n++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if n != 1 {
		t.Fatalf("got %d more chunks, want 1", n)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func TestE2EClientDisconnectCancelsAndReleases(t *testing.T) {
	es := startEngines(t, 4)
	c := startCaddy(t, dials(es), proxyOpts{})
	hold := make(chan struct{})
	defer close(hold)
	for _, e := range es {
		e.hold.Store(&hold)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/v1/chat/completions"),
		strings.NewReader(chatBody("qwen3-8b", true, [2]string{"user", longText("disconnect", 4000)})))
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
	if inflight := totalInflight(f); inflight != 1 {
		t.Fatalf("in flight while streaming = %d, want 1", inflight)
	}
	cancel()
	resp.Body.Close()

	eventually(t, "upstream request canceled", func() bool {
		n := 0
		for _, e := range es {
			n += int(e.canceled.Load())
		}
		return n == 1
	})
	eventually(t, "reservation released", func() bool {
		return totalInflight(f) == 0 && totalPending(f) == 0
	})
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

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting: %s", what)
}

func TestE2EUnhealthySkipped(t *testing.T) {
	es := startEngines(t, 4)
	c := startCaddy(t, dials(es), proxyOpts{Health: true})
	cl := newClient(c)
	sys := systemMsg(longText("health", 8192))
	_, eng := chat(t, cl, []openai.ChatCompletionMessageParamUnion{sys, userMsg("one")})
	var down *testEngine
	for _, e := range es {
		if itoa(e.id) == eng {
			down = e
		}
	}
	down.healthy.Store(false)
	f := lookupFleet("")
	eventually(t, "engine marked unhealthy", func() bool {
		for _, r := range f.replicas() {
			if r.Key == down.addr {
				return !r.Healthy
			}
		}
		return false
	})
	before := down.requests()
	for i := range 8 {
		_, got := chat(t, cl, []openai.ChatCompletionMessageParamUnion{sys, userMsg("turn " + itoa(i))})
		if got == eng {
			t.Fatalf("request %d went to the unhealthy engine %s", i, eng)
		}
	}
	if down.requests() != before {
		t.Fatalf("unhealthy engine received %d requests", down.requests()-before)
	}
	// The conversation moved as a whole: one healthy replica took it.
}

func TestE2EStateSurvivesReload(t *testing.T) {
	es := startEngines(t, 8)
	c := startCaddy(t, dials(es), proxyOpts{Extra: "one"})
	cl := newClient(c)
	msgs := []openai.ChatCompletionMessageParamUnion{systemMsg(longText("reload", 8192)), userMsg("first")}
	id, eng := chat(t, cl, msgs)
	f := lookupFleet("")
	entries := f.rt.Index().Entries()
	if entries == 0 {
		t.Fatal("index empty after a routed request")
	}

	c.reload(proxyOpts{Extra: "two"})
	resp, _ := c.post("/v1/models", "")
	if resp.Header.Get("X-Test-Config") != "two" {
		t.Fatal("reload did not take effect")
	}
	if g := lookupFleet(""); g != f {
		t.Fatal("reload replaced the fleet state")
	}
	if got := f.rt.Index().Entries(); got < entries {
		t.Fatalf("index shrank across reload: %d -> %d", entries, got)
	}
	msgs = append(msgs, openai.AssistantMessage("ok"), userMsg("second"))
	id2, eng2 := chat(t, cl, msgs)
	if eng2 != eng || id2 != id {
		t.Fatalf("after reload the conversation moved from %s (%s) to %s (%s)", eng, id, eng2, id2)
	}

	// A change of an index-relevant setting starts a new Router.
	c.reload(proxyOpts{Extra: "three", Policy: map[string]any{"block_tokens": 32}})
	if g := lookupFleet(""); g == f || g == nil {
		t.Fatal("block_tokens change kept the old index")
	}
}

func TestE2EFallbackWithoutBody(t *testing.T) {
	es := startEngines(t, 4)
	c := startCaddy(t, dials(es), proxyOpts{})
	resp, err := http.Get(c.url("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(resp.Header.Get(HeaderUpstream)) != 16 {
		t.Fatalf("GET /v1/models: %d, route id %q", resp.StatusCode, resp.Header.Get(HeaderUpstream))
	}
	eventually(t, "fallback reservation released", func() bool { return totalInflight(lookupFleet("")) == 0 })
}
