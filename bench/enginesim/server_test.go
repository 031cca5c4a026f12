package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

func startSim(t *testing.T, o Options) *Server {
	t.Helper()
	if o.TimeScale == 0 && !o.Instant {
		o.TimeScale = 50
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func client(s *Server) openai.Client {
	return openai.NewClient(option.WithBaseURL(s.URL()+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var weatherTool = openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
	Name: "get_weather",
	Parameters: shared.FunctionParameters{
		"type":       "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}},
		"required":   []string{"city"},
	},
})

func TestChatStreamingUsageAndCache(t *testing.T) {
	s := startSim(t, Options{})
	c := client(s)
	ctx := testCtx(t)
	params := openai.ChatCompletionNewParams{
		Model: s.Model(),
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage(engine.SyntheticText(1, 200)),
			openai.UserMessage("Summarise the plan in a few words."),
		},
		MaxTokens:     openai.Int(20),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	run := func() openai.ChatCompletion {
		stream := c.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if chunks < 3 {
			t.Errorf("only %d chunks", chunks)
		}
		return acc.ChatCompletion
	}
	first := run()
	if got := first.Choices[0].Message.Content; len(got) != 19*4 {
		t.Errorf("content has %d bytes, want %d (19 tokens + <|im_end|>)", len(got), 19*4)
	}
	if first.Choices[0].FinishReason != "stop" {
		t.Errorf("finish_reason %q", first.Choices[0].FinishReason)
	}
	u := first.Usage
	if u.CompletionTokens != 20 || u.PromptTokens == 0 || u.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first usage %+v", u)
	}
	second := run()
	if second.Choices[0].Message.Content != first.Choices[0].Message.Content {
		t.Error("output not deterministic for the same request")
	}
	if got, want := second.Usage.PromptTokensDetails.CachedTokens, (u.PromptTokens-1)/16*16; got != want {
		t.Errorf("repeat cached %d tokens, want %d", got, want)
	}
}

func TestToolCallsAndNextTurnCache(t *testing.T) {
	s := startSim(t, Options{})
	c := client(s)
	ctx := testCtx(t)
	msgs := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage("You are a helpful agent. " + engine.SyntheticText(3, 100)),
		openai.UserMessage("What is the weather in Paris?"),
	}
	params := openai.ChatCompletionNewParams{
		Model: s.Model(), Messages: msgs, MaxTokens: openai.Int(30),
		Tools: []openai.ChatCompletionToolUnionParam{weatherTool},
	}
	// Streaming tool call, accumulated by the SDK.
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	res, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	calls := res.Choices[0].Message.ToolCalls
	if len(calls) != 1 || calls[0].Function.Name != "get_weather" || res.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("tool calls %+v finish %q", calls, res.Choices[0].FinishReason)
	}
	var args map[string]string
	if err := json.Unmarshal([]byte(calls[0].Function.Arguments), &args); err != nil || args["city"] == "" {
		t.Fatalf("arguments %q: %v", calls[0].Function.Arguments, err)
	}
	sc := acc.Choices[0].Message.ToolCalls
	if len(sc) != 1 || sc[0].Function.Arguments != calls[0].Function.Arguments || sc[0].ID != calls[0].ID {
		t.Errorf("streamed tool call %+v differs from %+v", sc, calls)
	}
	if res.Usage.CompletionTokens != 30 {
		t.Errorf("completion tokens %d, want 30", res.Usage.CompletionTokens)
	}
	// Next turn: the assistant call and the tool result. Its prompt begins
	// with the first turn's prompt and reply, so all their full blocks hit.
	params.Messages = append(msgs, res.Choices[0].Message.ToParam(), openai.ToolMessage(`{"temp_c": 21}`, calls[0].ID))
	res2, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("turn 2: %v", err)
	}
	if res2.Choices[0].Message.Content == "" || len(res2.Choices[0].Message.ToolCalls) != 0 {
		t.Errorf("turn 2 (after a tool result, tool_choice auto) should answer in text: %+v", res2.Choices[0].Message)
	}
	if got, want := res2.Usage.PromptTokensDetails.CachedTokens, (res.Usage.PromptTokens+30)/16*16; got != want {
		t.Errorf("turn 2 cached %d tokens, want %d (turn 1 prompt + reply, full blocks)", got, want)
	}
	// tool_choice none never calls.
	params.Messages = msgs
	params.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
	res3, err := c.Chat.Completions.New(ctx, params)
	if err != nil || len(res3.Choices[0].Message.ToolCalls) != 0 {
		t.Errorf("tool_choice none: %v %+v", err, res3)
	}
}

func TestCompletionsSDK(t *testing.T) {
	s := startSim(t, Options{})
	c := client(s)
	ctx := testCtx(t)
	res, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(s.Model()),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(engine.SyntheticText(9, 64))},
		MaxTokens: openai.Int(12),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if res.Usage.PromptTokens != 64 || res.Usage.CompletionTokens != 12 || len(res.Choices[0].Text) != 48 {
		t.Errorf("usage %+v text %d bytes", res.Usage, len(res.Choices[0].Text))
	}
	stream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:         openai.CompletionNewParamsModel(s.Model()),
		Prompt:        openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3, 4, 5}},
		MaxTokens:     openai.Int(8),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var text strings.Builder
	var usage openai.CompletionUsage
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Text)
		}
		if ch.Usage.TotalTokens > 0 {
			usage = ch.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if text.Len() != 32 || usage.PromptTokens != 5 || usage.CompletionTokens != 8 {
		t.Errorf("streamed %d bytes, usage %+v", text.Len(), usage)
	}
}

func TestErrorsSDK(t *testing.T) {
	s := startSim(t, Options{MaxBodyBytes: 4096, Engine: engine.Config{MaxModelLen: 1000}})
	c := client(s)
	ctx := testCtx(t)
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Message, "does not exist") {
		t.Errorf("unknown model: %v", err)
	}
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: s.Model(), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("x", 8000))},
	})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 413 {
		t.Errorf("large body: %v", err)
	}
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: s.Model(), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(2000),
	})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, "maximum context length") {
		t.Errorf("context length: %v", err)
	}

	tests := []struct {
		name, path, body string
		want             int
	}{
		{"malformed", "/v1/chat/completions", `{"model":`, 400},
		{"no messages", "/v1/chat/completions", `{"model":"qwen3-32b","messages":[]}`, 400},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"x"}]}`, 400},
		{"bad max_tokens", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400},
		{"no prompt", "/v1/completions", `{"model":"qwen3-32b"}`, 400},
		{"unknown model", "/v1/completions", `{"model":"gpt-2","prompt":"x"}`, 404},
		{"unknown route", "/v1/embeddings", `{}`, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, e := postJSON(t, s.URL()+tt.path, tt.body, nil)
			if status != tt.want {
				t.Fatalf("status %d, want %d (%s)", status, tt.want, e)
			}
			var body struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(e, &body); err != nil || body.Error.Message == "" || body.Error.Type == "" || body.Error.Code != tt.want {
				t.Errorf("error body %s: %v", e, err)
			}
		})
	}
}

func postJSON(t *testing.T, url, body string, hdr http.Header) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), "POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v in %s", url, err, b)
		}
	}
	return res.StatusCode
}

func TestQueueFull(t *testing.T) {
	s := startSim(t, Options{TimeScale: 1, QueueFullStatus: 503, Engine: engine.Config{MaxRunningSeqs: 1, MaxWaiting: 1}})
	ctx := testCtx(t)
	c := client(s)
	// Two long requests fill the slot and the queue; the third is refused.
	for i := 0; i < 2; i++ {
		go c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: s.Model(), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprint(i))}, MaxTokens: openai.Int(2000),
		})
	}
	poll(20*time.Second, func() bool { st := s.Stats()[0].Engine; return st.Running == 1 && st.Waiting == 1 })
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: s.Model(), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}, MaxTokens: openai.Int(1),
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
		t.Fatalf("third request: %v, want 503", err)
	}
}

func TestModelsHealthTokenizeMetrics(t *testing.T) {
	s := startSim(t, Options{Model: "m1", ModelRoot: "/srv/m1", Engine: engine.Config{MaxModelLen: 4096}})
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			OwnedBy     string `json:"owned_by"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if st := getJSON(t, s.URL()+"/v1/models", &models); st != 200 || models.Object != "list" || len(models.Data) != 1 {
		t.Fatalf("models %d %+v", st, models)
	}
	if d := models.Data[0]; d.ID != "m1" || d.Root != "/srv/m1" || d.MaxModelLen != 4096 || d.OwnedBy != "vllm" || d.Object != "model" {
		t.Errorf("model %+v", d)
	}
	if st := getJSON(t, s.URL()+"/health", nil); st != 200 {
		t.Errorf("health %d", st)
	}

	chat := `{"model":"m1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}],"max_tokens":3}`
	st, b := postJSON(t, s.URL()+"/tokenize", chat, nil)
	var tok struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &tok); st != 200 || err != nil || tok.Count != len(tok.Tokens) || tok.MaxModelLen != 4096 {
		t.Fatalf("tokenize %d %s", st, b)
	}
	want := engine.RenderChat(nil, nil, []engine.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there"}}, true)
	if diff := cmp.Diff(want, tok.Tokens); diff != "" {
		t.Errorf("tokenize tokens (-want +got):\n%s", diff)
	}
	st, b = postJSON(t, s.URL()+"/v1/chat/completions", chat, nil)
	var res struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &res); st != 200 || err != nil || res.Usage.PromptTokens != tok.Count {
		t.Errorf("chat prompt tokens %d != tokenize count %d (%s)", res.Usage.PromptTokens, tok.Count, b)
	}
	st, b = postJSON(t, s.URL()+"/tokenize", `{"prompt":"abcdefgh"}`, nil)
	if err := json.Unmarshal(b, &tok); st != 200 || err != nil || tok.Count != 2 {
		t.Errorf("tokenize prompt %d %s", st, b)
	}

	res2, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(res2.Body)
	res2.Body.Close()
	for _, name := range []string{
		`vllm:num_requests_running{engine="0",model_name="m1"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="m1"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="m1"} 0`,
		`vllm:prefix_cache_queries_total{engine="0",model_name="m1"}`,
		`vllm:prefix_cache_hits_total{engine="0",model_name="m1"}`,
		`vllm:time_to_first_token_seconds_count{engine="0",model_name="m1"} 1`,
		`vllm:spec_decode_num_accepted_tokens_total`,
		`vllm:request_success_total{engine="0",model_name="m1"} 1`,
	} {
		if !bytes.Contains(m, []byte(name)) {
			t.Errorf("metrics lack %s", name)
		}
	}
}

func TestReasoningContent(t *testing.T) {
	s := startSim(t, Options{})
	body := `{"messages":[{"role":"user","content":"think first"}],"max_tokens":40,"chat_template_kwargs":{"enable_thinking":true}}`
	st, b := postJSON(t, s.URL()+"/v1/chat/completions", body, nil)
	var res struct {
		Choices []struct {
			Message struct {
				Content          string `json:"content"`
				ReasoningContent string `json:"reasoning_content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &res); st != 200 || err != nil {
		t.Fatalf("%d %s", st, b)
	}
	m := res.Choices[0].Message
	if m.ReasoningContent == "" || m.Content == "" || strings.Contains(m.Content, "think>") || res.Usage.CompletionTokens != 40 {
		t.Errorf("reasoning %q content %q usage %d", m.ReasoningContent, m.Content, res.Usage.CompletionTokens)
	}
	// Streamed reasoning deltas add up to the same text.
	c := client(s)
	stream := c.Chat.Completions.NewStreaming(testCtx(t), openai.ChatCompletionNewParams{
		Model: s.Model(), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("think first")},
		MaxTokens: openai.Int(40), ReasoningEffort: shared.ReasoningEffortLow,
	})
	var reasoning, content strings.Builder
	for stream.Next() {
		ch := stream.Current()
		if len(ch.Choices) == 0 {
			continue
		}
		content.WriteString(ch.Choices[0].Delta.Content)
		if f, ok := ch.Choices[0].Delta.JSON.ExtraFields["reasoning_content"]; ok {
			var r string
			_ = json.Unmarshal([]byte(f.Raw()), &r)
			reasoning.WriteString(r)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if reasoning.String() != m.ReasoningContent || content.String() != m.Content {
		t.Errorf("streamed reasoning %q content %q, want %q %q", reasoning.String(), content.String(), m.ReasoningContent, m.Content)
	}
}

func TestDataParallelRanksAndRecording(t *testing.T) {
	var mu sync.Mutex
	var seen []Recorded
	s := startSim(t, Options{DP: 3, OnRequest: func(r Recorded) {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
	}})
	body := `{"model":"qwen3-32b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	hdr := http.Header{"X-Data-Parallel-Rank": {"2"}, "X-Custom": {"abc"}}
	if st, b := postJSON(t, s.URL()+"/v1/chat/completions", body, hdr); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	rec, ok := s.LastRequestAt(2)
	if !ok || string(rec.Body) != body || rec.Header.Get("X-Custom") != "abc" || rec.Rank != 2 || rec.Path != "/v1/chat/completions" {
		t.Fatalf("rank 2 recorded %+v", rec)
	}
	if _, ok := s.LastRequestAt(0); ok {
		t.Error("rank 0 recorded a request routed to rank 2")
	}
	var last struct {
		Body    string              `json:"body"`
		Headers map[string][]string `json:"headers"`
		Rank    int                 `json:"rank"`
	}
	if st := getJSON(t, s.URL()+"/sim/last-request?rank=2", &last); st != 200 || last.Body != body || fmt.Sprint(last.Headers["X-Custom"]) != "[abc]" || last.Rank != 2 {
		t.Errorf("last-request endpoint %d %+v", st, last)
	}
	if st, _ := postJSON(t, s.URL()+"/v1/chat/completions", body, http.Header{"X-Data-Parallel-Rank": {"3"}}); st != 400 {
		t.Errorf("rank 3 of 3: status %d, want 400", st)
	}
	for i := 0; i < 6; i++ {
		if st, b := postJSON(t, s.URL()+"/v1/chat/completions", body, nil); st != 200 {
			t.Fatalf("%d %s", st, b)
		}
	}
	stats := s.Stats()
	for _, r := range stats {
		if r.Requests == 0 {
			t.Errorf("rank %d got no request without the header: %+v", r.Rank, stats)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 8 {
		t.Errorf("OnRequest saw %d requests, want 8", len(seen))
	}
}

func TestRealTimePacing(t *testing.T) {
	// A 20 ms step (the engine's default is 13.67 ms), so that pacing is
	// measured well above timer resolution.
	s := startSim(t, Options{TimeScale: 10, Engine: engine.Config{StepBase: 20 * time.Millisecond}})
	c := client(s)
	start := time.Now()
	stream := c.Chat.Completions.NewStreaming(testCtx(t), openai.ChatCompletionNewParams{
		Model: s.Model(), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("pace")}, MaxTokens: openai.Int(50),
	})
	var first time.Duration
	for stream.Next() {
		if ch := stream.Current(); first == 0 && len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			first = time.Since(start)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	// 50 steps of ~20 ms simulated at 10x: ~100 ms wall; first token after
	// one ~21 ms step: ~2 ms wall.
	if total < 80*time.Millisecond || total > 600*time.Millisecond || first > total/2 {
		t.Errorf("50 tokens at 10x took %v (first content after %v), want ~100ms", total, first)
	}
	st := s.Stats()[0].Engine
	if st.Now < 900*time.Millisecond {
		t.Errorf("engine clock %v after 50 decode steps", st.Now)
	}
}
