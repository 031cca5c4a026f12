package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// RankHeader routes a request to one data-parallel rank, as vLLM's.
const RankHeader = "X-data-parallel-rank"

// ReceivedHeader carries, on every generation response, the wall time
// (Unix nanoseconds) the engine had read the request: the load generator
// subtracts its send time to tell how long the router held the request
// (loadgen.Result.Routed; a precise router's wait for its preflight).
const ReceivedHeader = "X-Sim-Received"

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.handleGen(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.handleGen(w, r, false) })
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("GET /ramjet/identity", s.handleIdentity)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	s.adminRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("%s %s not found", r.Method, r.URL.Path)})
	})
	return mux
}

func (s *Server) adminRoutes(mux *http.ServeMux) {
	s.identityAdminRoutes(mux)
	mux.HandleFunc("GET /sim/faults", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, s.Faults()) })
	setFaults := func(w http.ResponseWriter, r *http.Request) {
		var f Faults
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&f); err != nil {
			writeError(w, badRequest("", "faults: %v", err))
			return
		}
		if err := s.SetFaults(f); err != nil {
			writeError(w, badRequest("", "faults: %v", err))
			return
		}
		writeJSON(w, 200, s.Faults())
	}
	mux.HandleFunc("PUT /sim/faults", setFaults)
	mux.HandleFunc("POST /sim/faults", setFaults)
	mux.HandleFunc("POST /sim/restart", func(w http.ResponseWriter, _ *http.Request) {
		s.Restart()
		writeJSON(w, 200, map[string]string{"status": "restarted"})
	})
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) {
		s.ResetPrefixCache()
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /sim/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, 200, s.Stats()) })
	mux.HandleFunc("GET /sim/last-request", func(w http.ResponseWriter, r *http.Request) {
		rec, ok := s.LastRequest()
		if q := r.URL.Query().Get("rank"); q != "" {
			n, err := strconv.Atoi(q)
			if err != nil {
				writeError(w, badRequest("rank", "rank must be an integer"))
				return
			}
			rec, ok = s.LastRequestAt(n)
		}
		if !ok {
			writeError(w, &apiError{Status: 404, Message: "no request recorded"})
			return
		}
		writeJSON(w, 200, map[string]any{
			"method": rec.Method, "path": rec.Path, "headers": rec.Header,
			"body": string(rec.Body), "rank": rec.Rank, "at": rec.At,
		})
	})
}

// MarshalJSON writes Latency as a Go duration string ("250ms").
func (f Faults) MarshalJSON() ([]byte, error) {
	type alias Faults
	return json.Marshal(struct {
		alias
		Latency string `json:"latency"`
	}{alias(f), f.Latency.String()})
}

// UnmarshalJSON reads Latency as a Go duration string.
func (f *Faults) UnmarshalJSON(b []byte) error {
	type alias Faults
	var v struct {
		*alias
		Latency string `json:"latency"`
	}
	v.alias = (*alias)(f)
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	f.Latency = 0
	if v.Latency != "" {
		d, err := time.ParseDuration(v.Latency)
		if err != nil {
			return fmt.Errorf("latency: %w", err)
		}
		f.Latency = d
	}
	return nil
}

// record keeps rec as the last request (of the server and of rank r, if
// routed) and calls the OnRequest hook.
func (s *Server) record(rec Recorded, r *rank) {
	s.mu.Lock()
	s.last = &rec
	s.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		r.last = &rec
		r.mu.Unlock()
	}
	if s.opts.OnRequest != nil {
		s.opts.OnRequest(rec)
	}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	created := time.Now().Unix()
	writeJSON(w, 200, map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id": s.opts.Model, "object": "model", "created": created, "owned_by": "vllm",
			"root": s.opts.ModelRoot, "parent": nil, "max_model_len": s.opts.Engine.MaxModelLen,
			"permission": []any{map[string]any{
				"id": "modelperm-enginesim", "object": "model_permission", "created": created,
				"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
				"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
				"organization": "*", "group": nil, "is_blocking": false,
			}},
		}},
	})
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge,
				Message: fmt.Sprintf("request body exceeds %d bytes", s.opts.MaxBodyBytes)}
		}
		return nil, badRequest("", "read body: %v", err)
	}
	return body, nil
}

func (s *Server) checkModel(model string) *apiError {
	if model != "" && model != s.opts.Model {
		return &apiError{Status: http.StatusNotFound, Param: "model",
			Message: fmt.Sprintf("The model `%s` does not exist.", model)}
	}
	return nil
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var req genRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, badRequest("", "malformed JSON: %v", err))
		return
	}
	if aerr := s.checkModel(req.Model); aerr != nil {
		writeError(w, aerr)
		return
	}
	var toks []uint32
	var err error
	if req.Messages != nil {
		var tools []tool
		if tools, err = parseTools(req.Tools); err == nil {
			addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
			toks, err = renderChat(&req, tools, addGen, s.tok())
		}
	} else {
		toks, err = promptTokens(req.Prompt, s.tok())
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if toks == nil {
		toks = []uint32{}
	}
	writeJSON(w, 200, map[string]any{
		"count": len(toks), "max_model_len": s.opts.Engine.MaxModelLen, "tokens": toks, "token_strs": nil,
	})
	if s.opts.Tokenized != nil && req.Messages != nil {
		s.opts.Tokenized.note(messagesKey(req.Messages), start, time.Now())
	}
}

func writeAPIError(w http.ResponseWriter, err error) {
	var a *apiError
	if errors.As(err, &a) {
		writeError(w, a)
		return
	}
	writeError(w, badRequest("", "%v", err))
}

// sleepCtx waits d or until ctx ends; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// genCall is one chat or completions request in flight.
type genCall struct {
	s       *Server
	w       http.ResponseWriter
	chat    bool
	id      string
	created int64
	req     genRequest
	prompt  []uint32
	out     *output
	rank    *rank
	engID   uint64
	die     int
	stall   int
}

func (s *Server) handleGen(w http.ResponseWriter, r *http.Request, chat bool) {
	body, aerr := s.readBody(w, r)
	rec := Recorded{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, Rank: -1, At: time.Now()}
	w.Header().Set(ReceivedHeader, strconv.FormatInt(rec.At.UnixNano(), 10))
	rk := s.pickRank()
	if h := r.Header.Get(RankHeader); h != "" {
		n, err := strconv.Atoi(h)
		if err != nil || n < 0 || n >= len(s.ranks) {
			s.record(rec, nil)
			writeError(w, badRequest("", "%s %q out of range [0,%d)", RankHeader, h, len(s.ranks)))
			return
		}
		rk = s.ranks[n]
	}
	rec.Rank = rk.idx
	s.record(rec, rk)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	faults := s.Faults()
	if faults.Latency > 0 && !sleepCtx(r.Context(), faults.Latency) {
		return
	}
	if faults.ErrorRate > 0 {
		s.mu.Lock()
		hit := s.rng.Float64() < faults.ErrorRate
		s.mu.Unlock()
		if hit {
			st := faults.ErrorStatus
			if st == 0 {
				st = http.StatusInternalServerError
			}
			writeError(w, &apiError{Status: st, Message: "injected fault"})
			return
		}
	}
	c := &genCall{s: s, w: w, chat: chat, created: time.Now().Unix(), die: faults.DieAfterTokens, stall: faults.StallAfterTokens}
	if err := json.Unmarshal(body, &c.req); err != nil {
		writeError(w, badRequest("", "malformed JSON: %v", err))
		return
	}
	if s.opts.Tokenized != nil && chat {
		s.opts.Tokenized.header(w, messagesKey(c.req.Messages))
	}
	if err := c.prepare(); err != nil {
		writeAPIError(w, err)
		return
	}
	c.rank = rk
	c.rank.count.Add(1)
	if faults.HangBeforeFirstToken {
		select {
		case <-r.Context().Done():
		case <-s.ctx.Done():
		}
		return
	}
	c.engID = s.ids.Add(1)
	if chat {
		c.id = fmt.Sprintf("chatcmpl-%016x", c.engID)
	} else {
		c.id = fmt.Sprintf("cmpl-%016x", c.engID)
	}
	p, err := c.rank.submit(engine.Request{ID: c.engID, Prompt: c.prompt, MaxTokens: c.out.total(), Output: c.out.tokens})
	if err != nil {
		writeError(w, s.submitError(err, len(c.prompt), c.out.total()))
		return
	}
	if c.req.Stream {
		c.stream(r.Context(), p)
	} else {
		c.respond(r.Context(), p)
	}
}

func (s *Server) submitError(err error, prompt, out int) *apiError {
	switch {
	case errors.Is(err, engine.ErrQueueFull):
		return &apiError{Status: s.opts.QueueFullStatus, Message: "The engine's waiting queue is full; retry later."}
	case errors.Is(err, engine.ErrContextLength):
		return badRequest("messages", "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.opts.Engine.MaxModelLen, prompt+out, prompt, out)
	}
	return badRequest("", "%v", err)
}

// prepare validates the request and plans its prompt and output.
func (c *genCall) prepare() error {
	r := &c.req
	if aerr := c.s.checkModel(r.Model); aerr != nil {
		return aerr
	}
	if r.N != nil && *r.N != 1 {
		return badRequest("n", "n must be 1 in the simulator")
	}
	n := c.s.opts.DefaultMaxTokens
	switch {
	case r.MaxCompletionTokens != nil:
		n = *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		n = *r.MaxTokens
	}
	if n < 1 {
		return badRequest("max_tokens", "max_tokens must be at least 1, got %d", n)
	}
	var err error
	if c.chat {
		if len(r.Messages) == 0 {
			return badRequest("messages", "messages must not be empty")
		}
		tools, err := parseTools(r.Tools)
		if err != nil {
			return err
		}
		if c.prompt, err = renderChat(r, tools, true, c.s.tok()); err != nil {
			return err
		}
		seed := seedOf(c.prompt)
		call, key, err := pickToolCall(tools, r.ToolChoice, r.Messages, seed)
		if err != nil {
			return err
		}
		c.out = buildOutput(c.s.tok(), seed, n, true, wantsReasoning(r), call, key)
		return nil
	}
	if c.prompt, err = promptTokens(r.Prompt, c.s.tok()); err != nil {
		return err
	}
	c.out = buildOutput(c.s.tok(), seedOf(c.prompt), n, false, false, nil, "")
	return nil
}

var errClosed = errors.New("server closed")

// await waits for progress, calling fn on each change, until the request
// finished, failed or its client went away.
func (c *genCall) await(ctx context.Context, p *pending, fn func(st pending) error) (pending, error) {
	seen := 0
	for {
		st := c.rank.snapshot(p)
		if st.err != nil {
			return st, st.err
		}
		if st.generated > seen || st.done {
			seen = st.generated
			if c.die > 0 && st.generated >= c.die {
				c.rank.abort(c.engID)
				st.generated, st.done = c.die, false
				_ = fn(st) // deliver exactly die tokens, then drop
				if f, ok := c.w.(http.Flusher); ok {
					f.Flush()
				}
				panic(http.ErrAbortHandler) // drop the connection mid-response
			}
			if c.stall > 0 && st.generated >= c.stall {
				c.rank.abort(c.engID)
				st.generated, st.done = c.stall, false
				_ = fn(st) // deliver exactly stall tokens, then go silent
				if f, ok := c.w.(http.Flusher); ok {
					f.Flush()
				}
				select {
				case <-ctx.Done():
					return st, ctx.Err()
				case <-c.s.ctx.Done():
					return st, errClosed
				}
			}
			if err := fn(st); err != nil {
				c.rank.abort(c.engID)
				return st, err
			}
		}
		if st.done {
			return st, nil
		}
		select {
		case <-p.notify:
		case <-ctx.Done():
			c.rank.abort(c.engID)
			return st, ctx.Err()
		case <-c.s.ctx.Done():
			return st, errClosed
		}
	}
}

func usageJSON(u engine.Usage) map[string]any {
	return map[string]any{
		"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens,
		"total_tokens":          u.PromptTokens + u.CompletionTokens,
		"prompt_tokens_details": map[string]any{"cached_tokens": u.CachedTokens},
	}
}

func (c *genCall) finishReason() string {
	switch {
	case !c.chat:
		return "length"
	case c.out.call != nil:
		return "tool_calls"
	}
	return "stop"
}

func (c *genCall) toolCallJSON(args string, header bool) map[string]any {
	tc := map[string]any{"index": 0, "function": map[string]any{"arguments": args}}
	if header {
		tc["id"], tc["type"] = c.out.call.ID, "function"
		tc["function"].(map[string]any)["name"] = c.out.call.Name
	}
	return tc
}

func (c *genCall) respond(ctx context.Context, p *pending) {
	st, err := c.await(ctx, p, func(pending) error { return nil })
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			writeError(c.w, &apiError{Status: http.StatusServiceUnavailable, Message: err.Error()})
		}
		return
	}
	o := c.out
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": c.finishReason(), "stop_reason": nil}
	object := "text_completion"
	if c.chat {
		object = "chat.completion"
		msg := map[string]any{"role": "assistant", "content": o.body, "reasoning_content": nil, "tool_calls": []any{}}
		if o.think != "" {
			msg["reasoning_content"] = o.reasoningText()
		}
		if o.call != nil {
			msg["content"] = nil
			msg["tool_calls"] = []any{map[string]any{
				"id": o.call.ID, "type": "function",
				"function": map[string]any{"name": o.call.Name, "arguments": o.call.Arguments},
			}}
		}
		choice["message"] = msg
	} else {
		choice["text"] = o.body
	}
	writeJSON(c.w, 200, map[string]any{
		"id": c.id, "object": object, "created": c.created, "model": c.s.opts.Model,
		"choices": []any{choice}, "usage": usageJSON(st.usage),
	})
}

func (c *genCall) stream(ctx context.Context, p *pending) {
	w := c.w
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	object := "text_completion"
	if c.chat {
		object = "chat.completion.chunk"
	}
	send := func(choices []any, usage any) error {
		m := map[string]any{"id": c.id, "object": object, "created": c.created, "model": c.s.opts.Model, "choices": choices}
		if usage != nil {
			m["usage"] = usage
		}
		b, _ := json.Marshal(m)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return nil
	}
	delta := func(d map[string]any) error {
		if c.chat {
			return send([]any{map[string]any{"index": 0, "delta": d, "logprobs": nil, "finish_reason": nil}}, nil)
		}
		return send([]any{map[string]any{"index": 0, "text": d["content"], "logprobs": nil, "finish_reason": nil}}, nil)
	}
	o := c.out
	sent := 0
	st, err := c.await(ctx, p, func(st pending) error {
		g := st.generated
		if c.chat && sent == 0 {
			if err := delta(map[string]any{"role": "assistant", "content": ""}); err != nil {
				return err
			}
		}
		if a, b := o.reasoningBytes(sent), o.reasoningBytes(g); b > a {
			if err := delta(map[string]any{"reasoning_content": o.reasoningText()[a:b]}); err != nil {
				return err
			}
		}
		a, b := o.bodyBytes(sent), o.bodyBytes(g)
		if b > a {
			if o.call == nil {
				if err := delta(map[string]any{"content": o.body[a:b]}); err != nil {
					return err
				}
			} else {
				header := a < o.nameEnd && b >= o.nameEnd
				lo, hi := max(a, o.argsAt[0]), min(b, o.argsAt[1])
				args := ""
				if hi > lo {
					args = o.body[lo:hi]
				}
				if header || args != "" {
					if err := delta(map[string]any{"tool_calls": []any{c.toolCallJSON(args, header)}}); err != nil {
						return err
					}
				}
			}
		}
		sent = g
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			b, _ := json.Marshal(map[string]any{"error": map[string]any{
				"message": err.Error(), "type": "ServiceUnavailableError", "param": nil, "code": 503}})
			fmt.Fprintf(w, "data: %s\n\n", b)
			if flusher != nil {
				flusher.Flush()
			}
		}
		return
	}
	last := map[string]any{"index": 0, "logprobs": nil, "finish_reason": c.finishReason(), "stop_reason": nil}
	if c.chat {
		last["delta"] = map[string]any{}
	} else {
		last["text"] = ""
	}
	_ = send([]any{last}, nil)
	if c.req.StreamOptions != nil && c.req.StreamOptions.IncludeUsage {
		_ = send([]any{}, usageJSON(st.usage))
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}
