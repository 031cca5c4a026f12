package module

// End-to-end tests of the serving surface: the ramjet directive and the
// production deploy/Caddyfile, run in a real in-process Caddy in front of
// engine simulators on 127.0.0.1, driven by the official OpenAI Go SDK.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/fleetstate"
)

const simModel = "qwen3-32b"

// sim is one engine simulator with the requests it received.
type sim struct {
	*enginesim.Server
	mu   sync.Mutex
	reqs []enginesim.Recorded
}

func (s *sim) received() []enginesim.Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]enginesim.Recorded(nil), s.reqs...)
}

func (s *sim) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// startRecordingSims starts n simulators that record what they receive; opt, when set, adjusts the options of
// simulator i.
func startRecordingSims(t *testing.T, n int, opt func(i int, o *enginesim.Options)) []*sim {
	t.Helper()
	sims := make([]*sim, n)
	for i := range sims {
		s := &sim{}
		o := enginesim.Options{Model: simModel, Instant: true, DefaultMaxTokens: 8}
		o.OnRequest = func(r enginesim.Recorded) {
			s.mu.Lock()
			s.reqs = append(s.reqs, r)
			s.mu.Unlock()
		}
		if opt != nil {
			opt(i, &o)
		}
		srv, err := enginesim.Start(context.Background(), o)
		if err != nil {
			t.Fatalf("starting simulator %d: %v", i, err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		s.Server = srv
		sims[i] = s
	}
	return sims
}

func simAddrs(sims []*sim) string {
	addrs := make([]string, len(sims))
	for i, s := range sims {
		addrs[i] = s.Addr()
	}
	return strings.Join(addrs, ",")
}

func (p *proxy) client(opts ...option.RequestOption) *openai.Client {
	cl := openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(p.base + "/v1/"),
		option.WithAPIKey("client-key"),
		option.WithMaxRetries(0),
		option.WithRequestTimeout(20 * time.Second),
	}, opts...)...)
	return &cl
}

func getHealth(t *testing.T, p *proxy) (int, fleetstate.HealthReport, string) {
	t.Helper()
	return readHealth(t, p.base+"/health")
}

// readHealth GETs a /health URL: the status, the answer and its body.
func readHealth(t testing.TB, url string) (int, fleetstate.HealthReport, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var h fleetstate.HealthReport
	if err := json.Unmarshal(body, &h); err != nil {
		t.Fatalf("/health is not JSON: %v: %s", err, body)
	}
	return resp.StatusCode, h, string(body)
}

// assertNoAddress fails if any simulator address or port shows in s.
func assertNoAddress(t *testing.T, what, s string, sims []*sim) {
	t.Helper()
	for _, sm := range sims {
		_, port, _ := net.SplitHostPort(sm.Addr())
		if strings.Contains(s, sm.Addr()) || strings.Contains(s, ":"+port) {
			t.Errorf("%s leaks upstream address %s: %s", what, sm.Addr(), s)
		}
	}
}

func headerText(h http.Header) string {
	var b strings.Builder
	_ = h.Write(&b)
	return b.String()
}

func chatParams(prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    simModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
	}
	if maxTokens > 0 {
		p.MaxTokens = openai.Int(maxTokens)
	}
	return p
}

// longPrompt makes a prompt of about n bytes that starts with seed, so
// that different seeds share no fingerprint block.
func longPrompt(seed string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s sentence %d about the topic of %s. ", seed, i, seed)
	}
	return b.String()
}

// TestServingDeployRJUpstreamOnly runs deploy/Caddyfile with RJ_UPSTREAM as
// the only ramjet setting (the listen ports are set only to keep the test
// off fixed ports): chat, streaming, models, health and metrics work.
func TestServingDeployRJUpstreamOnly(t *testing.T) {
	sims := startRecordingSims(t, 2, nil)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{"RJ_UPSTREAM": simAddrs(sims)})
	cl := p.client()
	ctx := context.Background()

	eventually(t, "health ok", func() bool { st, h, _ := getHealth(t, p); return st == 200 && h.Status == "ok" })

	var resp *http.Response
	cc, err := cl.Chat.Completions.New(ctx, chatParams("hello there", 8), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" {
		t.Errorf("chat answer = %+v", cc.Choices)
	}
	if id := resp.Header.Get("X-Ramjet-Upstream"); id == "" {
		t.Error("no X-Ramjet-Upstream on the response")
	}
	assertNoAddress(t, "response headers", headerText(resp.Header), sims)

	stream := cl.Chat.Completions.NewStreaming(ctx, chatParams("stream to me", 16))
	chunks := 0
	for stream.Next() {
		chunks++
	}
	if err := stream.Err(); err != nil || chunks < 2 {
		t.Errorf("stream: %d chunks, err %v", chunks, err)
	}

	page, err := cl.Models.List(ctx)
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != simModel {
		t.Fatalf("models = %+v, %v", page, err)
	}

	mresp, err := http.Get(p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mresp.Body.Close()
	if mresp.StatusCode != 200 {
		t.Errorf("metrics port: status %d", mresp.StatusCode)
	}
}

// TestServingRefusesRetiredEnv: any MD_* variable stops startup with an
// error naming it and its RJ_ replacement.
func TestServingRefusesRetiredEnv(t *testing.T) {
	sims := startRecordingSims(t, 1, nil)
	_, err := loadCaddyfile(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":     simAddrs(sims),
		"MD_AFFINITY_CAP": "100",
	})
	if err == nil {
		t.Fatal("config with MD_AFFINITY_CAP set loaded")
	}
	if !strings.Contains(err.Error(), "MD_AFFINITY_CAP") || !strings.Contains(err.Error(), "RJ_AFFINITY_CAP") {
		t.Errorf("error does not name the variable and its replacement: %v", err)
	}
}

// TestServingHealthStates stops and starts engines and watches /health go
// ok -> degraded -> unhealthy (503) -> ok, with opaque replica ids.
func TestServingHealthStates(t *testing.T) {
	sims := startRecordingSims(t, 2, nil)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":        simAddrs(sims),
		"RJ_HEALTH_INTERVAL": "100ms",
		"RJ_HEALTH_TIMEOUT":  "500ms",
	})
	state := func(want string, code int) func() bool {
		return func() bool {
			st, h, _ := getHealth(t, p)
			return st == code && h.Status == want
		}
	}
	eventually(t, "ok", state("ok", 200))
	_, h, body := getHealth(t, p)
	if h.Total != 2 || h.Healthy != 2 || len(h.Replicas) != 2 || h.Replicas[0].ID == h.Replicas[1].ID {
		t.Fatalf("health = %s", body)
	}
	assertNoAddress(t, "/health", body, sims)

	// The response's X-Ramjet-Upstream is one of the /health ids.
	var resp *http.Response
	if _, err := p.client().Chat.Completions.New(context.Background(), chatParams("which replica", 4), option.WithResponseInto(&resp)); err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("X-Ramjet-Upstream")
	if id != h.Replicas[0].ID && id != h.Replicas[1].ID {
		t.Errorf("X-Ramjet-Upstream %q is not a /health id (%s)", id, body)
	}

	stop := func(s *sim, down bool) {
		f := s.Faults()
		f.RefuseConnections = down
		if err := s.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
	stop(sims[0], true)
	eventually(t, "degraded", state("degraded", 200))
	_, h, body = getHealth(t, p)
	if h.Healthy != 1 {
		t.Errorf("degraded health = %s", body)
	}
	stop(sims[1], true)
	eventually(t, "unhealthy", state("unhealthy", 503))
	_, _, body = getHealth(t, p)
	if !strings.Contains(body, `"reason":"active_check"`) {
		t.Errorf("unhealthy replicas carry no reason: %s", body)
	}
	stop(sims[0], false)
	stop(sims[1], false)
	eventually(t, "ok again", state("ok", 200))
}

// TestServingModelsRewritten: the engines' lists merged, de-duplicated, with
// no root path, host or port, and max_model_len kept.
func TestServingModelsRewritten(t *testing.T) {
	sims := startRecordingSims(t, 3, func(i int, o *enginesim.Options) {
		if i == 2 {
			o.Model = "llama-3-8b"
			o.ModelRoot = "/mnt/weights/meta-llama/Llama-3-8B"
		}
		o.Engine.MaxModelLen = 32768
	})
	p := mustLoad(t, deployCaddyfile(t), map[string]string{"RJ_UPSTREAM": simAddrs(sims)})
	resp, err := http.Get(p.base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	for _, leak := range []string{"/models/", "/mnt/", "root", "127.0.0.1", "permission"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("/v1/models leaks %q: %s", leak, body)
		}
	}
	assertNoAddress(t, "/v1/models", string(body), sims)

	page, err := p.client().Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
		if m.JSON.ExtraFields["max_model_len"].Raw() != "32768" {
			t.Errorf("model %s: max_model_len = %q", m.ID, m.JSON.ExtraFields["max_model_len"].Raw())
		}
	}
	if strings.Join(ids, ",") != simModel+",llama-3-8b" && strings.Join(ids, ",") != "llama-3-8b,"+simModel {
		t.Errorf("model ids = %v", ids)
	}
	m, err := p.client().Models.Get(context.Background(), "llama-3-8b")
	if err != nil || m.ID != "llama-3-8b" {
		t.Errorf("GET /v1/models/llama-3-8b = %+v, %v", m, err)
	}
}

// TestServingErrors: every error ramjet produces is OpenAI-shaped JSON with
// the right status and no upstream address.
func TestServingErrors(t *testing.T) {
	sims := startRecordingSims(t, 2, nil)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":        simAddrs(sims),
		"RJ_MAX_BODY_SIZE":   "4KiB",
		"RJ_HEALTH_INTERVAL": "100ms",
	})
	eventually(t, "health ok", func() bool { st, _, _ := getHealth(t, p); return st == 200 })

	raw := func(body string) (int, string, http.Header) {
		resp, err := http.Post(p.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	check := func(name string, status int, body string, hdr http.Header, wantStatus int, wantCode string) {
		t.Helper()
		if status != wantStatus {
			t.Errorf("%s: status %d, want %d: %s", name, status, wantStatus, body)
		}
		var e struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil {
			t.Errorf("%s: not an OpenAI error: %s", name, body)
			return
		}
		for _, k := range []string{"message", "type", "param", "code"} {
			if _, ok := e.Error[k]; !ok {
				t.Errorf("%s: error lacks %q: %s", name, k, body)
			}
		}
		if e.Error["code"] != wantCode {
			t.Errorf("%s: code %v, want %s", name, e.Error["code"], wantCode)
		}
		if hdr.Get("Content-Type") != "application/json" {
			t.Errorf("%s: Content-Type %q", name, hdr.Get("Content-Type"))
		}
		assertNoAddress(t, name, body+headerText(hdr), sims)
	}

	st, body, hdr := raw(`{"model":"` + simModel + `","messages":[{"role":"user","content":"hi"`)
	check("malformed JSON", st, body, hdr, 400, "invalid_json")
	st, body, hdr = raw(`{"model":"` + simModel + `","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`)
	check("too large", st, body, hdr, 413, "request_too_large")

	// Unknown model, through the SDK.
	_, err := p.client().Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" || apiErr.Param != "model" {
		t.Errorf("unknown model: %v", err)
	}
	for _, s := range sims {
		if n := s.count(); n != 0 {
			t.Errorf("a rejected request reached an engine (%d requests)", n)
		}
	}

	// No usable replica: every engine refuses connections.
	for _, s := range sims {
		f := s.Faults()
		f.RefuseConnections = true
		if err := s.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "unhealthy", func() bool { st, _, _ := getHealth(t, p); return st == 503 })
	st, body, hdr = raw(`{"model":"` + simModel + `","messages":[{"role":"user","content":"hi"}]}`)
	check("no replica", st, body, hdr, 503, "no_replica_available")
	_, err = p.client().Chat.Completions.New(context.Background(), chatParams("anyone?", 4))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Type != "server_error" {
		t.Errorf("no replica through the SDK: %v", err)
	}
}

// TestServingHeadersAndToken: the engine sees the upstream token instead of
// the client's key, and none of the client's X-Ramjet-*, rank or hop-by-hop
// headers; the body arrives byte for byte.
func TestServingHeadersAndToken(t *testing.T) {
	for _, tc := range []struct {
		name     string
		token    string
		wantAuth string
	}{
		{"with token", "upstream-secret", "Bearer upstream-secret"},
		{"without token", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sims := startRecordingSims(t, 1, nil)
			p := mustLoad(t, deployCaddyfile(t), map[string]string{
				"RJ_UPSTREAM":       simAddrs(sims),
				"RJ_UPSTREAM_TOKEN": tc.token,
			})
			body := `{"model":"` + simModel + `","messages":[{"role":"user","content":"héllo\u0021"}],  "max_tokens":4}`
			req, _ := http.NewRequest(http.MethodPost, p.base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer client-key")
			req.Header.Set("X-Ramjet-Upstream", "forged")
			req.Header.Set("X-Ramjet-Debug", "1")
			req.Header.Set("X-Data-Parallel-Rank", "7")
			req.Header.Set("Connection", "X-Hop")
			req.Header.Set("X-Hop", "drop me")
			req.Header.Set("Proxy-Authorization", "Basic Zm9vOmJhcg==")
			req.Header.Set("X-Request-Id", "keep-me")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			got := sims[0].received()
			if len(got) != 1 {
				t.Fatalf("engine received %d requests", len(got))
			}
			r := got[0]
			if a := r.Header.Get("Authorization"); a != tc.wantAuth {
				t.Errorf("engine saw Authorization %q, want %q", a, tc.wantAuth)
			}
			for name := range r.Header {
				lower := strings.ToLower(name)
				if strings.HasPrefix(lower, "x-ramjet-") || lower == "x-data-parallel-rank" || lower == "x-hop" ||
					lower == "proxy-authorization" {
					t.Errorf("engine saw %s: %v", name, r.Header[name])
				}
			}
			if r.Header.Get("X-Request-Id") != "keep-me" {
				t.Error("an ordinary header was dropped")
			}
			if !bytes.Equal(r.Body, []byte(body)) {
				t.Errorf("body changed on the way:\n got %q\nwant %q", r.Body, body)
			}
			if v := resp.Header.Get("X-Ramjet-Upstream"); v == "forged" || v == "" {
				t.Errorf("response X-Ramjet-Upstream = %q", v)
			}
		})
	}
}

// TestServingDPRanks: with RJ_UPSTREAM_DP_RANKS each rank is its own
// replica: a conversation stays on one rank (pinned), different prompts
// spread over the ranks, and the engine sees the rank header.
func TestServingDPRanks(t *testing.T) {
	sims := startRecordingSims(t, 1, func(_ int, o *enginesim.Options) { o.DP = 4 })
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":          simAddrs(sims),
		"RJ_UPSTREAM_DP_RANKS": "4",
	})
	_, h, body := getHealth(t, p)
	if h.Total != 4 {
		t.Fatalf("/health lists %d replicas, want 4: %s", h.Total, body)
	}
	cl := p.client()
	ctx := context.Background()

	// Pinned: the turns of one conversation reach the same rank.
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(longPrompt("pinned system", 4000))}
	for turn := range 4 {
		msgs = append(msgs, openai.UserMessage(longPrompt("turn "+strconv.Itoa(turn), 300)))
		if _, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: simModel, Messages: msgs, MaxTokens: openai.Int(4)}); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, openai.AssistantMessage("ok"))
	}
	// The simulator records requests before routing them to a rank, so the
	// rank is read from the header, and checked against its per-rank
	// counters (the simulator serves the rank the header names).
	rankOf := func(r enginesim.Recorded) int {
		n, err := strconv.Atoi(r.Header.Get("X-Data-Parallel-Rank"))
		if err != nil {
			t.Fatalf("request without a valid rank header: %q", r.Header.Get("X-Data-Parallel-Rank"))
		}
		return n
	}
	got := sims[0].received()
	if len(got) != 4 {
		t.Fatalf("engine received %d requests, want 4", len(got))
	}
	for i, r := range got {
		if rankOf(r) != rankOf(got[0]) {
			t.Errorf("turn %d on rank %d, turn 0 on rank %d", i, rankOf(r), rankOf(got[0]))
		}
	}

	// Spread: unrelated prompts, several in flight at once, use every rank.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = cl.Chat.Completions.New(ctx, chatParams(longPrompt("topic "+strconv.Itoa(i*7919), 2000), 4))
		}()
	}
	wg.Wait()
	all := sims[0].received()
	ranks := map[int]uint64{}
	for _, r := range all[len(got):] {
		ranks[rankOf(r)]++
	}
	if len(ranks) < 3 {
		t.Errorf("16 unrelated prompts used ranks %v, want at least 3 of 4", ranks)
	}
	want := map[int]uint64{}
	for _, r := range all {
		want[rankOf(r)]++
	}
	for _, st := range sims[0].Stats() {
		if st.Requests != want[st.Rank] {
			t.Errorf("rank %d served %d requests, the headers named it %d times", st.Rank, st.Requests, want[st.Rank])
		}
	}
}

// TestServingOutputLengthTieBreak: with one speculative and one standard
// engine, cold prompts (cache and load tie) asking for long outputs go to
// the speculative engine and short ones to the standard engine.
func TestServingOutputLengthTieBreak(t *testing.T) {
	sims := startRecordingSims(t, 2, nil)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":           simAddrs(sims),
		"RJ_UPSTREAM_PROFILES":  "standard,speculative",
		"RJ_LONG_OUTPUT_TOKENS": "256",
	})
	cl := p.client()
	ctx := context.Background()
	for i := range 6 {
		if _, err := cl.Chat.Completions.New(ctx, chatParams(longPrompt("long "+strconv.Itoa(i), 600), 512)); err != nil {
			t.Fatal(err)
		}
	}
	if n0, n1 := sims[0].count(), sims[1].count(); n0 != 0 || n1 != 6 {
		t.Errorf("long outputs: standard got %d, speculative %d; want 0 and 6", n0, n1)
	}
	for i := range 6 {
		if _, err := cl.Chat.Completions.New(ctx, chatParams(longPrompt("short "+strconv.Itoa(i), 600), 16)); err != nil {
			t.Fatal(err)
		}
	}
	if n0, n1 := sims[0].count(), sims[1].count(); n0 != 6 || n1 != 6 {
		t.Errorf("short outputs: standard got %d (want 6), speculative %d (want 6)", n0, n1)
	}
}

// TestServingRetriesLoseNothing: an engine that stops accepting
// connections before any health check notices is still chosen for its warm
// cache; the request is retried on another engine with the same body, and
// the client sees a normal answer.
func TestServingRetriesLoseNothing(t *testing.T) {
	for round := range 4 {
		t.Run(strconv.Itoa(round), func(t *testing.T) {
			sims := startRecordingSims(t, 3, nil)
			p := mustLoad(t, deployCaddyfile(t), map[string]string{
				"RJ_UPSTREAM":        simAddrs(sims),
				"RJ_HEALTH_INTERVAL": "1h", // only the first check runs
			})
			cl := p.client()
			sys := openai.SystemMessage(longPrompt("retry system "+strconv.Itoa(round), 8000))
			if _, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model: simModel, Messages: []openai.ChatCompletionMessageParamUnion{sys, openai.UserMessage("one")},
				MaxTokens: openai.Int(2),
			}); err != nil {
				t.Fatal(err)
			}
			warm := -1
			for i, s := range sims {
				if s.count() == 1 {
					warm = i
				}
			}
			if warm < 0 {
				t.Fatal("no engine served the first turn")
			}
			f := sims[warm].Faults()
			f.RefuseConnections = true
			if err := sims[warm].SetFaults(f); err != nil {
				t.Fatal(err)
			}
			body := `{"model":"` + simModel + `","max_tokens":2,"messages":[{"role":"system","content":` +
				strconv.Quote(longPrompt("retry system "+strconv.Itoa(round), 8000)) + `},{"role":"user","content":"two \u00e9"}]}`
			resp, err := http.Post(p.base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			served := 0
			for i, s := range sims {
				if i == warm {
					continue
				}
				for _, r := range s.received() {
					served++
					if !bytes.Equal(r.Body, []byte(body)) {
						t.Errorf("retried request reached engine %d with a different body (%d bytes, sent %d)", i, len(r.Body), len(body))
					}
				}
			}
			if served != 1 {
				t.Errorf("the retried request reached %d other engines, want 1", served)
			}
		})
	}
}

// TestServingClientTokens: with RJ_CLIENT_TOKENS, the API and the model
// list need one of the keys (401 otherwise); /health stays open; the
// engines never see the client's key.
func TestServingClientTokens(t *testing.T) {
	sims := startRecordingSims(t, 1, nil)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":       simAddrs(sims),
		"RJ_CLIENT_TOKENS":  "key-one,key-two",
		"RJ_UPSTREAM_TOKEN": "engine-token",
	})
	ctx := context.Background()
	good := p.client(option.WithAPIKey("key-two"))
	if _, err := good.Chat.Completions.New(ctx, chatParams("hi", 2)); err != nil {
		t.Fatalf("chat with a valid key: %v", err)
	}
	if _, err := good.Models.List(ctx); err != nil {
		t.Fatalf("models with a valid key: %v", err)
	}
	bad := p.client(option.WithAPIKey("key-three"))
	var apiErr *openai.Error
	_, err := bad.Chat.Completions.New(ctx, chatParams("hi", 2))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
		t.Errorf("chat with a wrong key: %v", err)
	}
	_, err = bad.Models.List(ctx)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
		t.Errorf("models with a wrong key: %v", err)
	}
	if st, _, _ := getHealth(t, p); st != 200 {
		t.Errorf("/health needs a key: status %d", st)
	}
	got := sims[0].received()
	if len(got) != 1 {
		t.Fatalf("engine received %d requests, want 1", len(got))
	}
	if a := got[0].Header.Get("Authorization"); a != "Bearer engine-token" {
		t.Errorf("engine saw Authorization %q", a)
	}
}

// TestServingReload: a config reload (another routing knob) keeps /health
// and /v1/models working against the new proxy, with the same replica ids
// when RJ_ROUTE_ID_SECRET is set.
func TestServingReload(t *testing.T) {
	sims := startRecordingSims(t, 2, nil)
	env := map[string]string{
		"RJ_UPSTREAM":        simAddrs(sims),
		"RJ_ROUTE_ID_SECRET": "stable",
		"RJ_HEALTH_INTERVAL": "100ms",
	}
	p := mustLoad(t, deployCaddyfile(t), env)
	_, before, body := getHealth(t, p)
	if before.Status != "ok" {
		t.Fatalf("health before reload: %s", body)
	}

	t.Setenv("RJ_ALPHA", "0.5")
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(deployCaddyfile(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(cfg, []byte(`"alpha":0.5`)) {
		t.Fatal("the reloaded config does not carry the new knob")
	}
	if cfg, err = handOver(cfg, p.addrs...); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("reload: %v", err)
	}
	// The old servers share the handed-over sockets until their shutdown
	// ends (see testCaddy.reload): wait for it, then start afresh.
	if !poll(30*time.Second, func() bool { return shutdownStacks() == "" }) {
		t.Fatalf("the old config's servers still shutting down 30s after a reload:\n%s", shutdownStacks())
	}
	http.DefaultClient.CloseIdleConnections()
	_, after, body := getHealth(t, p)
	if after.Status != "ok" || len(after.Replicas) != 2 {
		t.Fatalf("health after reload: %s", body)
	}
	for i := range after.Replicas {
		if after.Replicas[i].ID != before.Replicas[i].ID {
			t.Errorf("replica %d id changed across the reload: %s -> %s", i, before.Replicas[i].ID, after.Replicas[i].ID)
		}
	}
	// The engines going down is seen by the new config's health checks.
	for _, s := range sims {
		f := s.Faults()
		f.RefuseConnections = true
		if err := s.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "unhealthy after reload", func() bool { st, _, _ := getHealth(t, p); return st == 503 })
	for _, s := range sims {
		if err := s.SetFaults(enginesim.Faults{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "ok after reload", func() bool { st, _, _ := getHealth(t, p); return st == 200 })
	if _, err := p.client().Models.List(context.Background()); err != nil {
		t.Errorf("models after reload: %v", err)
	}
}

// TestServingHandWritten: the handlers work the same written out around
// reverse_proxy { lb_policy ramjet }.
func TestServingHandWritten(t *testing.T) {
	sims := startRecordingSims(t, 1, func(_ int, o *enginesim.Options) { o.DP = 2 })
	a := sims[0].Addr()
	src := `{
	admin off
}
http://{$RJ_LISTEN} {
	route {
		ramjet_health /health ` + a + ` ` + a + `
		ramjet_models /v1/models* ` + a + `
		ramjet_observe
		ramjet_guard ` + a + ` {
			upstream_token {env.RJ_UPSTREAM_TOKEN}
		}
		reverse_proxy ` + a + ` ` + a + ` {
			lb_policy ramjet
		}
	}
}
`
	p := mustLoad(t, src, map[string]string{"RJ_UPSTREAM_TOKEN": "tok"})
	st, h, body := getHealth(t, p)
	if st != 200 || h.Total != 2 || h.Status != "ok" {
		t.Fatalf("/health: %d %s", st, body)
	}
	var resp *http.Response
	cl := p.client()
	if _, err := cl.Chat.Completions.New(context.Background(), chatParams("hand written", 2), option.WithResponseInto(&resp)); err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("X-Ramjet-Upstream")
	if id != h.Replicas[0].ID && id != h.Replicas[1].ID {
		t.Errorf("X-Ramjet-Upstream %q not among /health ids %s", id, body)
	}
	if got := sims[0].received(); len(got) != 1 || got[0].Header.Get("Authorization") != "Bearer tok" {
		t.Errorf("engine saw %d requests / wrong token", len(got))
	}
	if page, err := cl.Models.List(context.Background()); err != nil || len(page.Data) != 1 {
		t.Errorf("models: %v %v", page, err)
	}
}

// TestServingStreamsUnbuffered: through the guard and the directive's
// proxy, stream chunks reach the client as the engine makes them.
func TestServingStreamsUnbuffered(t *testing.T) {
	sims := startRecordingSims(t, 1, func(_ int, o *enginesim.Options) { o.Instant = false; o.TimeScale = 1 })
	p := mustLoad(t, deployCaddyfile(t), map[string]string{"RJ_UPSTREAM": simAddrs(sims)})
	cl := p.client()
	start := time.Now()
	stream := cl.Chat.Completions.NewStreaming(context.Background(), chatParams("stream slowly", 48))
	var first time.Duration
	chunks := 0
	for stream.Next() {
		if chunks == 0 {
			first = time.Since(start)
		}
		chunks++
	}
	total := time.Since(start)
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 10 {
		t.Fatalf("only %d chunks", chunks)
	}
	if first > total/2 {
		t.Errorf("first chunk after %v of %v: the stream was buffered", first, total)
	}
	t.Logf("first chunk %v, whole stream %v, %d chunks", first, total, chunks)
}
