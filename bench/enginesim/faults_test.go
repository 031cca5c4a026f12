package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

func chatParams(s *Server, text string, n int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model: s.Model(), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}, MaxTokens: openai.Int(n),
	}
}

func setFaultsHTTP(t *testing.T, base string, f string) Faults {
	t.Helper()
	req, _ := http.NewRequest("PUT", base+"/sim/faults", strings.NewReader(f))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("PUT /sim/faults %d %s", res.StatusCode, b)
	}
	var got Faults
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestFaultErrorRateAndLatency(t *testing.T) {
	s := startSim(t, Options{})
	c := client(s)
	ctx := testCtx(t)
	got := setFaultsHTTP(t, s.URL(), `{"error_rate":1,"error_status":503,"latency":"150ms"}`)
	if got.ErrorRate != 1 || got.ErrorStatus != 503 || got.Latency != 150*time.Millisecond {
		t.Fatalf("faults %+v", got)
	}
	start := time.Now()
	_, err := c.Chat.Completions.New(ctx, chatParams(s, "x", 2))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 {
		t.Fatalf("want injected 503, got %v", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("latency fault: answered after %v", d)
	}
	if err := s.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Chat.Completions.New(ctx, chatParams(s, "x", 2)); err != nil {
		t.Errorf("after clearing faults: %v", err)
	}
	if err := s.SetFaults(Faults{ErrorRate: 2}); err == nil {
		t.Error("error_rate 2 accepted")
	}
}

func TestFaultHangBeforeFirstToken(t *testing.T) {
	s := startSim(t, Options{Faults: Faults{HangBeforeFirstToken: true}})
	c := client(s)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Chat.Completions.New(ctx, chatParams(s, "x", 2))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hang: %v, want deadline exceeded", err)
	}
	s.SetFaults(Faults{})
	if _, err := c.Chat.Completions.New(testCtx(t), chatParams(s, "x", 2)); err != nil {
		t.Errorf("after clearing: %v", err)
	}
}

func TestFaultDieMidStream(t *testing.T) {
	s := startSim(t, Options{Faults: Faults{DieAfterTokens: 5}})
	c := client(s)
	ctx := testCtx(t)
	stream := c.Chat.Completions.NewStreaming(ctx, chatParams(s, "tell me more", 50))
	var content strings.Builder
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			content.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if stream.Err() == nil {
		t.Error("stream ended cleanly despite die_after_tokens")
	}
	if content.Len() == 0 || content.Len() >= 49*4 {
		t.Errorf("got %d content bytes before dying, want some but not all", content.Len())
	}
	if _, err := c.Chat.Completions.New(ctx, chatParams(s, "again", 50)); err == nil {
		t.Error("non-stream request survived die_after_tokens")
	}
	// The aborted requests left the engine (blocks of a request aborted
	// mid-step are released when that step ends).
	poll(20*time.Second, func() bool { st := s.Stats()[0].Engine; return st.Running == 0 && st.UsedBlocks == 0 })
	if st := s.Stats()[0].Engine; st.Running != 0 || st.UsedBlocks != 0 {
		t.Errorf("engine still busy after dropped connections: %+v", st)
	}
}

func TestFaultRefuseConnections(t *testing.T) {
	s := startSim(t, Options{AdminAddr: "127.0.0.1:0"})
	setFaultsHTTP(t, s.AdminURL(), `{"refuse_connections":true}`)
	_, err := http.Get(s.URL() + "/health")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("health while refusing: %v, want connection refused", err)
	}
	setFaultsHTTP(t, s.AdminURL(), `{}`)
	if st := getJSON(t, s.URL()+"/health", nil); st != 200 {
		t.Errorf("health after clearing %d", st)
	}
}

func TestFaultRestartEmptiesCache(t *testing.T) {
	s := startSim(t, Options{})
	c := client(s)
	ctx := testCtx(t)
	text := engine.SyntheticText(5, 300)
	if _, err := c.Chat.Completions.New(ctx, chatParams(s, text, 2)); err != nil {
		t.Fatal(err)
	}
	res, err := c.Chat.Completions.New(ctx, chatParams(s, text, 2))
	if err != nil || res.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("warm request: %v %+v", err, res)
	}
	if st, b := postJSON(t, s.URL()+"/sim/restart", "", nil); st != 200 {
		t.Fatalf("restart %d %s", st, b)
	}
	res, err = c.Chat.Completions.New(ctx, chatParams(s, text, 2))
	if err != nil || res.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("after restart: %v cached %d, want 0", err, res.Usage.PromptTokensDetails.CachedTokens)
	}
	if st := s.Stats()[0].Engine; st.Finished != 1 {
		t.Errorf("counters not reset by restart: %+v", st)
	}
}

func TestFaultCollapsedSpecAcceptance(t *testing.T) {
	s := startSim(t, Options{Instant: true, Engine: engine.Config{SpecTokens: 3}})
	c := client(s)
	ctx := testCtx(t)
	if _, err := c.Chat.Completions.New(ctx, chatParams(s, "a", 100)); err != nil {
		t.Fatal(err)
	}
	before := s.Stats()[0].Engine
	if before.SpecAcceptedTokens == 0 {
		t.Fatalf("no accepted tokens with acceptance 0.7: %+v", before)
	}
	setFaultsHTTP(t, s.URL(), `{"spec_acceptance":0}`)
	if _, err := c.Chat.Completions.New(ctx, chatParams(s, "b", 100)); err != nil {
		t.Fatal(err)
	}
	after := s.Stats()[0].Engine
	if after.SpecAcceptedTokens != before.SpecAcceptedTokens || after.SpecDraftTokens <= before.SpecDraftTokens {
		t.Errorf("collapsed acceptance still accepted: before %+v after %+v", before, after)
	}
	res, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !bytes.Contains(m, []byte("vllm:spec_decode_num_draft_tokens_total")) {
		t.Error("metrics lack spec decode counters")
	}
}

func TestFaultStallMidStream(t *testing.T) {
	s := startSim(t, Options{Faults: Faults{StallAfterTokens: 3}})
	c := client(s)
	// The client gives up 500ms after the first chunk (a deadline from
	// the start would cut before any chunk on a loaded machine).
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	stream := c.Chat.Completions.NewStreaming(ctx, chatParams(s, "tell me more", 50))
	chunks := 0
	for stream.Next() {
		if chunks++; chunks == 1 {
			defer time.AfterFunc(500*time.Millisecond, cancel).Stop()
		}
	}
	if chunks == 0 {
		t.Fatalf("no chunk before the stall: %v", stream.Err())
	}
	if !errors.Is(stream.Err(), context.Canceled) {
		t.Fatalf("stalled stream ended with %v, want the client's giving up", stream.Err())
	}
	// The engine let go of the stalled request when the client left.
	poll(20*time.Second, func() bool { st := s.Stats()[0].Engine; return st.Running == 0 && st.UsedBlocks == 0 })
	if st := s.Stats()[0].Engine; st.Running != 0 || st.UsedBlocks != 0 {
		t.Errorf("engine still busy after the stalled client left: %+v", st)
	}
	if err := s.SetFaults(Faults{StallAfterTokens: -1}); err == nil {
		t.Error("stall_after_tokens -1 accepted")
	}
}
