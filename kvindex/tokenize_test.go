package kvindex

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/selection"
)

// tokenizeServer is a vLLM-shaped /tokenize endpoint on 127.0.0.1: one
// token per byte of the prompt (or of the messages' JSON).
type tokenizeServer struct {
	*httptest.Server
	calls atomic.Int64
	delay time.Duration
	gate  chan struct{} // when set, each request waits for a receive
	last  atomic.Value  // map[string]any of the last request
}

func newTokenizeServer(t *testing.T) *tokenizeServer {
	s := &tokenizeServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.calls.Add(1)
		if r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
			http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
			return
		}
		if s.gate != nil {
			select {
			case <-s.gate:
			case <-r.Context().Done():
				return
			}
		}
		if s.delay > 0 {
			select {
			case <-time.After(s.delay):
			case <-r.Context().Done():
				return
			}
		}
		var req map[string]any
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.last.Store(req)
		var text string
		if m, ok := req["messages"]; ok {
			b, _ := json.Marshal(m)
			text = string(b)
		} else if p, ok := req["prompt"].(string); ok {
			text = p
		}
		if text == "error" {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		toks := make([]int, len(text))
		for i := range text {
			toks[i] = int(text[i])
		}
		json.NewEncoder(w).Encode(map[string]any{"tokens": toks, "count": len(toks), "max_model_len": 4096})
	}))
	t.Cleanup(s.Close)
	return s
}

func promptReq(p string) TokenizeRequest {
	b, _ := json.Marshal(p)
	return TokenizeRequest{Model: "m", Prompt: b}
}

func TestTokenizeShapesAndCache(t *testing.T) {
	srv := newTokenizeServer(t)
	var observed atomic.Int64
	tk := NewTokenizer(TokenizerConfig{Timeout: 2 * time.Second,
		OnLatency: func(time.Duration) { observed.Add(1) }})
	ctx := context.Background()

	got, err := tk.Tokenize(ctx, srv.URL, 1, promptReq("abc"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]uint32{'a', 'b', 'c'}, got); diff != "" {
		t.Errorf("tokens (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]any{"model": "m", "prompt": "abc"}, srv.last.Load()); diff != "" {
		t.Errorf("prompt request (-want +got):\n%s", diff)
	}
	chat := TokenizeRequest{Model: "m", Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`),
		Tools: json.RawMessage(`[{"type":"function"}]`)}
	if _, err := tk.Tokenize(ctx, srv.URL+"/", 2, chat); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"model": "m", "add_generation_prompt": true,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"tools":    []any{map[string]any{"type": "function"}}}
	if diff := cmp.Diff(want, srv.last.Load()); diff != "" {
		t.Errorf("chat request (-want +got):\n%s", diff)
	}
	// Cached: no new request.
	if _, err := tk.Tokenize(ctx, srv.URL, 1, promptReq("ignored")); err != nil {
		t.Fatal(err)
	}
	if toks, ok := tk.Cached(1); !ok || len(toks) != 3 {
		t.Errorf("Cached(1) = %v, %v", toks, ok)
	}
	if _, ok := tk.Cached(99); ok {
		t.Error("Cached(99) hit")
	}
	if srv.calls.Load() != 2 || tk.CacheHits() != 2 || tk.CacheMisses() != 2 || observed.Load() != 2 {
		t.Errorf("calls %d hits %d misses %d observed %d", srv.calls.Load(), tk.CacheHits(),
			tk.CacheMisses(), observed.Load())
	}
}

func TestTokenizeFallbacks(t *testing.T) {
	srv := newTokenizeServer(t)
	ctx := context.Background()

	t.Run("error status", func(t *testing.T) {
		tk := NewTokenizer(TokenizerConfig{Timeout: 2 * time.Second})
		if _, err := tk.Tokenize(ctx, srv.URL, 1, promptReq("error")); err == nil {
			t.Fatal("no error")
		}
		if tk.Fallbacks(FallbackError) != 1 {
			t.Errorf("error fallbacks %d", tk.Fallbacks(FallbackError))
		}
		if n, _ := tk.CacheLen(); n != 0 {
			t.Error("an error was cached")
		}
	})
	t.Run("too many tokens", func(t *testing.T) {
		tk := NewTokenizer(TokenizerConfig{Timeout: 2 * time.Second, MaxTokens: 3})
		if _, err := tk.Tokenize(ctx, srv.URL, 1, promptReq("abcd")); err == nil {
			t.Fatal("no error")
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		tk := NewTokenizer(TokenizerConfig{Timeout: 2 * time.Second})
		if _, err := tk.Tokenize(ctx, "http://127.0.0.1:1", 1, promptReq("a")); err == nil {
			t.Fatal("no error")
		}
		if tk.Fallbacks(FallbackError) != 1 {
			t.Errorf("error fallbacks %d", tk.Fallbacks(FallbackError))
		}
	})
	t.Run("timeout", func(t *testing.T) {
		slow := newTokenizeServer(t)
		slow.delay = 300 * time.Millisecond
		tk := NewTokenizer(TokenizerConfig{Timeout: 30 * time.Millisecond})
		start := time.Now()
		_, err := tk.Tokenize(ctx, slow.URL, 1, promptReq("a"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		if d := time.Since(start); d > 250*time.Millisecond {
			t.Errorf("timeout took %v", d)
		}
		if tk.Fallbacks(FallbackTimeout) != 1 {
			t.Errorf("timeout fallbacks %d", tk.Fallbacks(FallbackTimeout))
		}
	})
}

func TestTokenizeConcurrency(t *testing.T) {
	srv := newTokenizeServer(t)
	srv.gate = make(chan struct{})
	tk := NewTokenizer(TokenizerConfig{Timeout: 5 * time.Second, MaxConcurrent: 1})
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([][]uint32, 5)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], _ = tk.Tokenize(ctx, srv.URL, 7, promptReq("xy"))
		}()
	}
	// Wait until the leader's request reached the server and the others
	// joined it.
	eventually(t, "one request in flight", func() bool { return srv.calls.Load() == 1 && tk.Shared() == 4 })
	// A different key while at the limit falls back at once.
	if _, err := tk.Tokenize(ctx, srv.URL, 8, promptReq("z")); !errors.Is(err, ErrBusy) {
		t.Errorf("err = %v, want ErrBusy", err)
	}
	srv.gate <- struct{}{}
	wg.Wait()
	for i, r := range results {
		if !cmp.Equal(r, []uint32{'x', 'y'}) {
			t.Errorf("caller %d got %v", i, r)
		}
	}
	if srv.calls.Load() != 1 || tk.Fallbacks(FallbackBusy) != 1 {
		t.Errorf("calls %d busy %d", srv.calls.Load(), tk.Fallbacks(FallbackBusy))
	}
}

func TestTokenizeCacheBounds(t *testing.T) {
	srv := newTokenizeServer(t)
	tk := NewTokenizer(TokenizerConfig{Timeout: 2 * time.Second, CacheEntries: 3, CacheTokens: 10})
	for i := 0; i < 6; i++ {
		if _, err := tk.Tokenize(context.Background(), srv.URL, uint64(i), promptReq(fmt.Sprint(i*1111))); err != nil {
			t.Fatal(err)
		}
		if n, toks := tk.CacheLen(); n > 3 || toks > 10 {
			t.Fatalf("cache %d entries %d tokens past its bounds", n, toks)
		}
	}
}

func TestFeaturesKey(t *testing.T) {
	c := selection.Config{}
	c.SetDefaults()
	x := selection.NewExtractor(c)
	key := func(body string) uint64 {
		f := x.NewFeatures()
		if err := x.Parse(selection.EndpointChat, []byte(body), f); err != nil {
			t.Fatal(err)
		}
		return FeaturesKey(f)
	}
	a := key(`{"model":"m","messages":[{"role":"user","content":"hello there"}],"temperature":0.1}`)
	b := key(`{"messages":[{"content":"hello there","role":"user"}],"model":"m","stream":true}`)
	if a != b {
		t.Error("same prompt, different keys")
	}
	long := strings.Repeat("lorem ipsum ", 40)
	c1 := key(`{"model":"m","messages":[{"role":"user","content":"` + long + `a"}]}`)
	c2 := key(`{"model":"m","messages":[{"role":"user","content":"x` + long + `"}]}`)
	c3 := key(`{"model":"m2","messages":[{"role":"user","content":"hello there"}]}`)
	if c1 == c2 || a == c3 {
		t.Error("different prompts share a key")
	}
	// The documented caveat: a difference in the sub-block tail only.
	if key(`{"model":"m","messages":[{"role":"user","content":"hello therf"}]}`) != a {
		t.Error("tail-only difference changed the key; update FeaturesKey's doc")
	}
}

func TestRequestKey(t *testing.T) {
	a := RequestKey(promptReq("hello there"))
	if a != RequestKey(promptReq("hello there")) || a == RequestKey(promptReq("hello therf")) {
		t.Error("RequestKey is not exact")
	}
	// Field boundaries count.
	if RequestKey(TokenizeRequest{Model: "ab", Prompt: []byte("c")}) ==
		RequestKey(TokenizeRequest{Model: "a", Prompt: []byte("bc")}) {
		t.Error("field boundaries ignored")
	}
}

// BenchmarkPreciseDecision is the CPU cost of the precise path of one
// routing decision when the tokenization is cached: the request key, the
// cache hit, the block keys, Annotate over the candidates and Predict.
func BenchmarkPreciseDecision(b *testing.B) {
	for _, n := range []int{2048, 16384} {
		b.Run(fmt.Sprintf("tokens=%d/replicas=8", n), func(b *testing.B) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				toks := make([]int, n)
				for i := range toks {
					toks[i] = i % 30000
				}
				json.NewEncoder(w).Encode(map[string]any{"tokens": toks, "count": n})
			}))
			defer srv.Close()
			tk := NewTokenizer(TokenizerConfig{Timeout: 5 * time.Second})
			x := New(Config{BlockSize: 16})
			msgs, _ := json.Marshal([]map[string]string{{"role": "user", "content": strings.Repeat("word ", n)}})
			req := TokenizeRequest{Model: "m", Messages: msgs}
			toks, err := tk.Tokenize(context.Background(), srv.URL, RequestKey(req), req)
			if err != nil {
				b.Fatal(err)
			}
			reps := make([]Replica, 8)
			for i := range reps {
				reps[i], _ = x.Register(fmt.Sprint(i))
				m := len(toks) * (i + 1) / 8 / 16 * 16
				hs := make([]uint64, m/16)
				for j := range hs {
					hs[j] = uint64(i)<<32 | uint64(j+1)
				}
				x.Apply(reps[i], batchOf(storedEv(0, false, 16, toks[:m], hs...)))
			}
			cands := make([]selection.Candidate, 8)
			scratch := make([]int, 8)
			keys := make([]uint64, 0, n/16)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				t, err := tk.Tokenize(context.Background(), srv.URL, RequestKey(req), req)
				if err != nil {
					b.Fatal(err)
				}
				keys = x.Keys(keys[:0], 0, t)
				x.Annotate(keys, reps, cands, scratch)
				x.Predict(reps[0], keys, time.Second)
			}
		})
	}
}

// TestTokenizeRequestAppendJSON: the body fetch sends is, compacted, what
// encoding/json makes of the request.
func TestTokenizeRequestAppendJSON(t *testing.T) {
	for _, r := range []TokenizeRequest{
		{Model: "m", Messages: json.RawMessage(`[ {"role":"user", "content":"a\u00e9\"b"} ]`)},
		{Model: "q\"<&>\u2028", Messages: json.RawMessage(`[{"role":"system","content":"s"}]`), Tools: json.RawMessage(`[{"type":"function"}]`)},
		{Model: "m", Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), NoGenerationPrompt: true},
		{Model: "m", Prompt: json.RawMessage(`"a prompt"`)},
		{Model: "", Prompt: json.RawMessage(`[1, 2, 3]`)},
	} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := json.Compact(&got, r.appendJSON(nil)); err != nil {
			t.Fatalf("%+v: appendJSON is not JSON: %v", r, err)
		}
		if got.String() != string(want) {
			t.Errorf("%+v:\n got %s\nwant %s", r, got.String(), want)
		}
	}
}

func BenchmarkTokenizeRequestBody(b *testing.B) {
	msgs := json.RawMessage(`[{"role":"system","content":"` + strings.Repeat("a shared system prompt ", 5000) + `"},{"role":"user","content":"q"}]`)
	r := TokenizeRequest{Model: "m", Messages: msgs}
	b.Run("append", func(b *testing.B) {
		b.SetBytes(int64(len(msgs)))
		b.ReportAllocs()
		for range b.N {
			_ = r.appendJSON(make([]byte, 0, len(msgs)+64))
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(msgs)))
		b.ReportAllocs()
		for range b.N {
			if _, err := json.Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
