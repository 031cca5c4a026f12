package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// echoEngine is an OpenAI-shaped responder that models nothing: it reads
// and decodes the whole request body, as any engine must, then answers
// max_tokens tokens at once (streamed as one chunk per token when asked).
// It measures the proxy with an engine that costs almost nothing, where the
// engine simulator's instant mode still pays for tokenizing and caching a
// 256 KiB prompt.
//
// Its usage object reports "prompt_tokens_details":{"cached_tokens":0}
// (details true): an engine that holds nothing of any prompt, which makes
// ramjet's index drop what it believed the replica held and learn it again
// on every request (selection.Router.Observe). Without details it omits
// prompt_tokens_details, as vLLM and SGLang do by default (vLLM's
// --enable-prompt-tokens-details, SGLang's --enable-cache-report turn it
// on). ramjet reads that absent count as 0 cached today (usage.Result),
// so its index relearns every prompt under both shapes (bench/RESULTS.md,
// "what of ramjet's extra is issue-required work").
type echoEngine struct {
	srv     *http.Server
	addr    string
	wg      sync.WaitGroup
	details bool
}

// startEcho starts an echo engine listing model (details: see echoEngine).
func startEcho(model string, details bool) (*echoEngine, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("echo engine: %w", err)
	}
	e := &echoEngine{addr: ln.Addr().String(), details: details}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.chat)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	// The model list every OpenAI-compatible engine serves: ramjet's guard
	// checks request models against it, and asks again (once a second, on
	// the request path) while no engine has listed any.
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"`+model+`","object":"model","created":0,"owned_by":"echo"}]}`)
	})
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		_ = e.srv.Serve(ln)
	}()
	return e, nil
}

func (e *echoEngine) Addr() string { return e.addr }
func (e *echoEngine) URL() string  { return "http://" + e.addr }

func (e *echoEngine) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.srv.Shutdown(ctx)
	e.wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (e *echoEngine) chat(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model     string            `json:"model"`
		MaxTokens int               `json:"max_tokens"`
		Stream    bool              `json:"stream"`
		Messages  []json.RawMessage `json:"messages"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":%q,"type":"invalid_request_error","param":null,"code":null}}`, err.Error())
		return
	}
	n := max(1, req.MaxTokens)
	prompt := len(body) / 4
	usage := `{"prompt_tokens":` + strconv.Itoa(prompt) + `,"completion_tokens":` + strconv.Itoa(n) +
		`,"total_tokens":` + strconv.Itoa(prompt+n)
	if e.details {
		usage += `,"prompt_tokens_details":{"cached_tokens":0}`
	}
	usage += "}"
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		content := make([]byte, 0, 4*n)
		for range n {
			content = append(content, " the"...)
		}
		fmt.Fprintf(w, `{"id":"chatcmpl-echo","object":"chat.completion","created":0,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"length"}],"usage":%s}`,
			req.Model, content, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	head := `data: {"id":"chatcmpl-echo","object":"chat.completion.chunk","created":0,"model":"` + req.Model + `","choices":[`
	for i := range n {
		fin := "null"
		if i == n-1 {
			fin = `"length"`
		}
		io.WriteString(w, head+`{"index":0,"delta":{"content":" the"},"finish_reason":`+fin+`}]}`+"\n\n")
		if fl != nil {
			fl.Flush()
		}
	}
	io.WriteString(w, head+`],"usage":`+usage+"}\n\ndata: [DONE]\n\n")
}
