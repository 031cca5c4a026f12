package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// obsEngine is a small OpenAI-compatible engine on 127.0.0.1 for the
// observability tests: a prefix cache of 64-byte blocks (bounded), usage
// with prompt_tokens_details.cached_tokens (one token per 4 prompt bytes),
// streaming with stream_options.include_usage, a prefill delay per
// uncached token, and scripted failures by model name ("reject" answers
// 400, "crash" 500).
type obsEngine struct {
	id   int
	addr string
	srv  *http.Server

	prefillPerToken time.Duration
	tokenDelay      time.Duration

	healthy atomic.Bool
	// release ends the wait of held requests (X-Obs-Hold).
	release chan struct{}

	mu     sync.Mutex
	blocks map[uint64]struct{}
	// Totals of what the engine reported in usage, to check the metrics.
	prompt, cached, completion int64
	requests                   int
}

const obsEngineMaxBlocks = 1 << 16

func startObsEngines(t testing.TB, n int, prefillPerToken, tokenDelay time.Duration) []*obsEngine {
	t.Helper()
	es := make([]*obsEngine, n)
	for i := range es {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		e := &obsEngine{id: i, addr: ln.Addr().String(), blocks: map[uint64]struct{}{},
			prefillPerToken: prefillPerToken, tokenDelay: tokenDelay, release: make(chan struct{})}
		e.healthy.Store(true)
		e.srv = &http.Server{Handler: e, ReadHeaderTimeout: 5 * time.Second}
		go e.srv.Serve(ln)
		t.Cleanup(func() { e.srv.Close() })
		es[i] = e
	}
	return es
}

func obsDials(es []*obsEngine) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.addr
	}
	return out
}

// totals returns what the engine reported in usage so far.
func (e *obsEngine) totals() (requests int, prompt, cached, completion int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.requests, e.prompt, e.cached, e.completion
}

// cachedTokens runs the prompt through the prefix cache: the leading
// blocks already held are cached; every block is held afterwards.
func (e *obsEngine) cachedTokens(prompt []byte) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var h uint64
	hit := true
	var cached int64
	for i := 0; i+64 <= len(prompt); i += 64 {
		h = xxhash.Sum64(append(fmt.Appendf(nil, "%016x", h), prompt[i:i+64]...))
		if _, ok := e.blocks[h]; ok && hit {
			cached += 16
		} else {
			hit = false
		}
		if len(e.blocks) >= obsEngineMaxBlocks {
			clear(e.blocks)
		}
		e.blocks[h] = struct{}{}
	}
	return cached
}

func (e *obsEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		if !e.healthy.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
		return
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"obs"}]}`)
		return
	}
	var req struct {
		Model     string `json:"model"`
		Stream    bool   `json:"stream"`
		MaxTokens int    `json:"max_tokens"`
		Messages  []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 16<<20)).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bad json","type":"invalid_request_error","param":null,"code":null}}`, http.StatusBadRequest)
		return
	}
	switch req.Model {
	case "reject":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"rejected","type":"invalid_request_error","param":"model","code":null}}`)
		return
	case "crash":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"message":"engine crashed","type":"server_error","param":null,"code":null}}`)
		return
	}
	var prompt bytes.Buffer
	for _, m := range req.Messages {
		prompt.WriteString(m.Role)
		prompt.WriteString(m.Content)
	}
	promptTokens := int64(prompt.Len() / 4)
	cached := min(e.cachedTokens(prompt.Bytes()), promptTokens)
	out := int64(max(1, min(req.MaxTokens, 64)))
	if req.MaxTokens == 0 {
		out = 8
	}
	e.mu.Lock()
	e.requests++
	if !req.Stream || req.StreamOptions.IncludeUsage {
		// Only what the engine reports counts.
		e.prompt += promptTokens
		e.cached += cached
		e.completion += out
	}
	e.mu.Unlock()
	w.Header().Set("X-Obs-Engine", fmt.Sprint(e.id))
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}`,
		promptTokens, out, promptTokens+out, cached)
	// X-Obs-Hold: stream the first chunk, then wait for release (a
	// request that keeps its reservation).
	hold := r.Header.Get("X-Obs-Hold") != ""
	if d := e.prefillPerToken * time.Duration(promptTokens-cached); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":0,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":%s}`,
			req.Model, strings.Repeat("tok ", int(out)), usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	for i := int64(0); i < out; i++ {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"},\"finish_reason\":null}]%s}\n\n",
			req.Model, map[bool]string{true: `,"usage":null`, false: ""}[req.StreamOptions.IncludeUsage])
		rc.Flush()
		if hold && i == 0 {
			select {
			case <-e.release:
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
		if e.tokenDelay > 0 {
			select {
			case <-time.After(e.tokenDelay):
			case <-r.Context().Done():
				return
			}
		}
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[],\"usage\":%s}\n\n", req.Model, usage)
	}
	io.WriteString(w, "data: [DONE]\n\n")
	rc.Flush()
}

// obsChat renders a chat request body; turns alternate user/assistant.
func obsChat(model string, stream bool, system string, turns ...string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", system}}
	for i, t := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, t})
	}
	req := map[string]any{"model": model, "messages": msgs, "max_tokens": 8, "stream": stream}
	if stream {
		req["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(req)
	return string(b)
}

// obsText is deterministic filler of about n bytes.
func obsText(seed string, n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "%s line %d of the context. ", seed, i)
	}
	return sb.String()
}
