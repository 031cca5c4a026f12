package module

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestAnswerCorrectsIndex: the engine's own cached-token count in an
// answer reaches the index (Router.Observe through the metrics observer).
// The engine evicts a prompt the index believes it holds (its prefix cache
// is reset behind ramjet's back); the next answer reports no cached tokens
// where the index predicted the whole prompt, and the replica gets a
// horizon: beliefs older than the eviction no longer count.
func TestAnswerCorrectsIndex(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{TimeScale: 1, Engine: engine.Config{CapacityTokens: 1 << 20, BlockSize: 16}})
	c := startObsCaddy(t, ss.dials(), obsOpts{})
	body := chatBody("qwen3-8b", false, [2]string{"system", longText("learn", 4000)}, [2]string{"user", "hello"})
	if resp, b := c.chat(body); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	f := lookupFleet("")
	slot, ok := f.Base().Lookup(ss[0].Addr())
	if !ok {
		t.Fatal("engine not registered")
	}
	if h := f.Base().Index().Horizon(slot); h != 0 {
		t.Fatalf("horizon %d before any eviction", h)
	}
	// The same prompt again, served from the engine's cache: the answer
	// confirms the index.
	if resp, b := c.chat(body); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	if h := f.Base().Index().Horizon(slot); h != 0 {
		t.Fatalf("horizon %d after a confirming answer", h)
	}
	resp, err := http.Post("http://"+ss[0].Addr()+"/reset_prefix_cache", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp, b := c.chat(body); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	eventually(t, "the eviction learned from the answer", func() bool { return f.Base().Index().Horizon(slot) > 0 })
}

// TestAnswerWithoutCachedCount: an engine that reports no cached count
// (vLLM without --enable-prompt-tokens-details sends
// "prompt_tokens_details": null) says nothing about evictions: the index
// keeps its beliefs. Read as "0 cached", every answer gave the replica a
// horizon as if it had evicted the prompt.
func TestAnswerWithoutCachedCount(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"qwen3-8b","object":"model"}]}`)
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"qwen3-8b","choices":[{"index":0,`+
			`"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d,"prompt_tokens_details":null}}`, len(b)/4, len(b)/4+1)
	}))
	t.Cleanup(eng.Close)
	dial := strings.TrimPrefix(eng.URL, "http://")
	c := startObsCaddy(t, []string{dial}, obsOpts{})
	body := chatBody("qwen3-8b", false, [2]string{"system", longText("unreported", 4000)}, [2]string{"user", "hello"})
	done := histCount(t, processMetrics().Own, "ramjet_request_duration_seconds")
	for range 3 {
		if resp, b := c.chat(body); resp.StatusCode != 200 {
			t.Fatalf("chat: %s: %s", resp.Status, b)
		}
	}
	// Every answer's End (Observe, then the metrics) has run.
	eventually(t, "three requests recorded", func() bool {
		return histCount(t, processMetrics().Own, "ramjet_request_duration_seconds") >= done+3
	})
	f := lookupFleet("")
	slot, ok := f.Base().Lookup(dial)
	if !ok {
		t.Fatal("engine not registered")
	}
	if h := f.Base().Index().Horizon(slot); h != 0 {
		t.Errorf("horizon %d after answers without a cached count: read as evictions", h)
	}
}
