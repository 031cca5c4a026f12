package module

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
)

// newTestGuard provisions a guard in front of one real engine listing
// model "m1".
func newTestGuard(t *testing.T, g *Guard) *Guard {
	t.Helper()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m1","object":"model","root":"/models/m1"}]}`)
	}))
	t.Cleanup(engine.Close)
	g.Upstreams = []string{strings.TrimPrefix(engine.URL, "http://")}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := g.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Cleanup() })
	return g
}

// serveGuard runs one request through g with next as the rest of the chain.
func serveGuard(t *testing.T, g *Guard, req *http.Request, next caddyhttp.HandlerFunc) *httptest.ResponseRecorder {
	t.Helper()
	repl := caddy.NewReplacer()
	ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
	req = req.WithContext(ctx)
	rec := httptest.NewRecorder()
	if err := g.ServeHTTP(rec, req, next); err != nil {
		t.Fatalf("ServeHTTP returned %v", err)
	}
	return rec
}

func TestGuardRejects(t *testing.T) {
	g := newTestGuard(t, &Guard{GuardSettings: edge.GuardSettings{MaxBodySize: 64, AllowPaths: []string{"/v1/audio/*"}}})
	forwarded := 0
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		forwarded++
		w.WriteHeader(http.StatusOK)
		return nil
	})
	tests := []struct {
		name       string
		path, body string
		ctype      string
		wantStatus int
		wantCode   string
	}{
		{"ok", "/v1/chat/completions", `{"model":"m1"}`, "application/json", 200, ""},
		{"malformed", "/v1/chat/completions", `{"model":`, "application/json", 400, edge.CodeInvalidJSON},
		{"too large", "/v1/completions", `{"model":"m1","prompt":"` + strings.Repeat("x", 80) + `"}`, "application/json", 413, edge.CodeBodyTooLarge},
		{"unknown model", "/v1/chat/completions", `{"model":"nope"}`, "application/json", 404, edge.CodeModelNotFound},
		{"multipart to an LLM route", "/v1/chat/completions", `--x--`, "multipart/form-data; boundary=x", 415, edge.CodeUnsupportedMedia},
		{"text to an LLM route", "/v1/completions", `{"model":"m1"}`, "text/plain", 415, edge.CodeUnsupportedMedia},
		{"messages as a string", "/v1/chat/completions", `{"model":"m1","messages":"hi"}`, "application/json", 400, edge.CodeInvalidType},
		{"engine route refused", "/reset_prefix_cache", ``, "application/json", 404, edge.CodeUnknownURL},
		{"multipart not parsed", "/v1/audio/transcriptions", `--x--`, "multipart/form-data; boundary=x", 200, ""},
		{"other route not parsed", "/v1/audio/whatever", `not json`, "application/json", 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := forwarded
			req := httptest.NewRequest(http.MethodPost, tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", tt.ctype)
			rec := serveGuard(t, g, req, next)
			if rec.Code != tt.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tt.wantStatus, rec.Body)
			}
			if tt.wantCode == "" {
				if forwarded != before+1 {
					t.Error("request not forwarded")
				}
				return
			}
			if forwarded != before {
				t.Error("rejected request was forwarded")
			}
			we := decodeWireError(t, rec.Body.Bytes())
			if we.Error.Code == nil || *we.Error.Code != tt.wantCode {
				t.Errorf("code = %v, want %s", we.Error.Code, tt.wantCode)
			}
		})
	}
}

func TestGuardChunkedTooLarge(t *testing.T) {
	g := newTestGuard(t, &Guard{GuardSettings: edge.GuardSettings{MaxBodySize: 16}})
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", io.MultiReader(strings.NewReader(strings.Repeat("y", 40))))
	req.ContentLength = -1
	rec := serveGuard(t, g, req, func(http.ResponseWriter, *http.Request) error {
		t.Error("forwarded")
		return nil
	})
	if rec.Code != 413 {
		t.Fatalf("status = %d, want 413", rec.Code)
	}
}

func TestGuardForwardsBodyAndCredentials(t *testing.T) {
	tests := []struct {
		name     string
		guard    *Guard
		wantAuth string
	}{
		{"token replaces client auth", &Guard{Engines: Engines{UpstreamToken: "up-tok"}}, "Bearer up-tok"},
		{"client auth dropped by default", &Guard{}, ""},
		{"client auth forwarded on request", &Guard{GuardSettings: edge.GuardSettings{ForwardClientAuth: true}}, "Bearer client"},
	}
	body := `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newTestGuard(t, tt.guard)
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer client")
			req.Header.Set("Api-Key", "client")
			req.Header.Set("X-Ramjet-Upstream", "forged")
			rec := serveGuard(t, g, req, func(w http.ResponseWriter, r *http.Request) error {
				if got := r.Header.Get("Authorization"); got != tt.wantAuth {
					t.Errorf("Authorization = %q, want %q", got, tt.wantAuth)
				}
				if tt.wantAuth != "Bearer client" && r.Header.Get("Api-Key") != "" {
					t.Error("Api-Key forwarded")
				}
				if r.Header.Get("X-Ramjet-Upstream") != "" {
					t.Error("X-Ramjet-Upstream forwarded")
				}
				// Read once into ramjet's request state (the policy reuses
				// it), and forwarded byte for byte.
				if st := lookupRequest(r); st == nil || st.body == nil || !bytes.Equal(st.body.Bytes(), []byte(body)) {
					t.Error("body not kept in the request state")
				}
				if got, _ := io.ReadAll(r.Body); string(got) != body {
					t.Errorf("body = %q", got)
				}
				w.WriteHeader(200)
				return nil
			})
			if rec.Code != 200 {
				t.Fatalf("status %d", rec.Code)
			}
		})
	}
}

func TestGuardRewritesChainErrors(t *testing.T) {
	g := newTestGuard(t, &Guard{})
	dial := g.Upstreams[0]
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m1"}`))
	rec := serveGuard(t, g, req, func(w http.ResponseWriter, r *http.Request) error {
		return caddyhttp.Error(http.StatusBadGateway, errors.New("dial tcp "+dial+": connection refused"))
	})
	if rec.Code != 502 {
		t.Fatalf("status = %d", rec.Code)
	}
	if strings.Contains(rec.Body.String(), dial) {
		t.Errorf("error body leaks upstream address: %s", rec.Body)
	}
	decodeWireError(t, rec.Body.Bytes())

	// A response that has started is not rewritten; headers naming the
	// upstream are dropped.
	req = httptest.NewRequest(http.MethodGet, "/v1/models/m1", nil)
	req = req.WithContext(context.WithValue(req.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	rec = httptest.NewRecorder()
	err := g.ServeHTTP(rec, req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Location", "http://"+dial+"/v1/x")
		w.Header().Set("X-Kept", "yes")
		w.WriteHeader(200)
		_, _ = io.WriteString(w, "partial")
		return errors.New("stream broke")
	}))
	if err == nil || rec.Body.String() != "partial" {
		t.Errorf("started response: err = %v, body %q", err, rec.Body)
	}
	if rec.Header().Get("Location") != "" || rec.Header().Get("X-Kept") != "yes" {
		t.Errorf("headers = %v", rec.Header())
	}
}

// TestGuardParse: the guard answers what selection.Parse refuses with an
// OpenAI-shaped 400 naming the problem and the field, checks the decoded
// model name, and leaves the one parse in the request state for the
// matcher and the policy.
func TestGuardParse(t *testing.T) {
	g := newTestGuard(t, &Guard{GuardSettings: edge.GuardSettings{AllowPaths: []string{"/openai/*"}}})
	deep := func(n int) string {
		return `{"model":"m1","messages":[{"role":"user","content":"hi"}],"x":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
	}
	tests := []struct {
		name, path, body string
		wantStatus       int
		wantCode         string
		wantParam        string
		wantMsg          string
		wantModel        string
	}{
		{"ok", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`, 200, "", "", "", "m1"},
		{"escaped key", "/v1/chat/completions", `{"\u006dodel":"m1","messages":[]}`, 200, "", "", "", "m1"},
		{"escaped key, unknown model", "/v1/chat/completions", `{"\u006dodel":"nope"}`, 404, edge.CodeModelNotFound, "model", "nope", ""},
		{"escaped model", "/v1/chat/completions", `{"model":"m\u0031"}`, 200, "", "", "", "m1"},
		{"null model", "/v1/chat/completions", `{"model":null,"messages":[]}`, 200, "", "", "", ""},
		{"300 deep", "/v1/chat/completions", deep(300), 200, "", "", "", "m1"},
		{"too deep", "/v1/chat/completions", deep(selection.MaxDepth), 400, edge.CodeInvalidJSON, "", "nesting too deep", ""},
		{"malformed", "/v1/chat/completions", `{"model":"m1","messages":[`, 400, edge.CodeInvalidJSON, "messages", "not valid JSON", ""},
		{"not an object", "/v1/chat/completions", `[1,2]`, 400, edge.CodeInvalidType, "", "must be a JSON object", ""},
		{"model type", "/v1/embeddings", `{"model":7,"input":"x"}`, 400, edge.CodeInvalidType, "model", "model must be a string", ""},
		{"messages type", "/v1/chat/completions", `{"model":"m1","messages":"hello"}`, 400, edge.CodeInvalidType, "messages", "messages must be an array", ""},
		{"content type", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":5}]}`, 400, edge.CodeInvalidType, "messages.[0].content", "content must be", ""},
		{"prompt type", "/v1/completions", `{"model":"m1","prompt":{}}`, 400, edge.CodeInvalidType, "prompt", "prompt must be", ""},
		{"prefixed route", "/openai/v1/chat/completions", `{"model":"m1","messages":{}}`, 400, edge.CodeInvalidType, "messages", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen *reqState
			var f *selection.Features
			parses := bodyParses.Load()
			req := httptest.NewRequest(http.MethodPost, tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			rec := serveGuard(t, g, req, func(w http.ResponseWriter, r *http.Request) error {
				// While the request runs: at its end the state is pooled.
				if seen = lookupRequest(r); seen != nil {
					f = seen.features(sharedExtractor(), selection.EndpointForPath(tt.path))
				}
				w.WriteHeader(http.StatusOK)
				return nil
			})
			if rec.Code != tt.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", rec.Code, tt.wantStatus, rec.Body)
			}
			if got := bodyParses.Load() - parses; got != 1 {
				t.Errorf("the guard parsed the body %d times, want 1", got)
			}
			if tt.wantStatus == 200 {
				// The rest of the chain (matcher, policy) finds the parse.
				if seen == nil {
					t.Fatal("no request state")
				}
				if f == nil || string(f.Model) != tt.wantModel {
					t.Fatalf("features = %+v, want model %q", f, tt.wantModel)
				}
				if got := bodyParses.Load() - parses; got != 1 {
					t.Errorf("the body was parsed %d times, want 1", got)
				}
				return
			}
			we := decodeWireError(t, rec.Body.Bytes())
			if we.Error.Code == nil || *we.Error.Code != tt.wantCode {
				t.Errorf("code = %v, want %s", we.Error.Code, tt.wantCode)
			}
			param := ""
			if we.Error.Param != nil {
				param = *we.Error.Param
			}
			if param != tt.wantParam || !strings.Contains(we.Error.Message, tt.wantMsg) || we.Error.Type != edge.TypeInvalidRequest {
				t.Errorf("error = %+v (param %q), want param %q and a message containing %q", we.Error, param, tt.wantParam, tt.wantMsg)
			}
		})
	}
}

func TestClientAuth(t *testing.T) {
	t.Setenv("RJ_TEST_KEYS", "k1, k2")
	a := newClientAuth("{env.RJ_TEST_KEYS}")
	tests := []struct {
		name   string
		header map[string]string
		ok     bool
	}{
		{"bearer", map[string]string{"Authorization": "Bearer k2"}, true},
		{"lower-case scheme", map[string]string{"Authorization": "bearer k1"}, true},
		{"api-key", map[string]string{"Api-Key": "k1"}, true},
		{"wrong", map[string]string{"Authorization": "Bearer k3"}, false},
		{"prefix of a key", map[string]string{"Authorization": "Bearer k"}, false},
		{"basic", map[string]string{"Authorization": "Basic azE6"}, false},
		{"none", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			ae := a.Check(r)
			if (ae == nil) != tt.ok {
				t.Fatalf("check = %v, want ok %v", ae, tt.ok)
			}
			if ae != nil && (ae.Status != 401 || *ae.Code != "invalid_api_key") {
				t.Errorf("error = %+v", ae)
			}
		})
	}
	if newClientAuth("{env.RJ_TEST_UNSET_KEYS}").Check(httptest.NewRequest(http.MethodGet, "/", nil)) != nil {
		t.Error("no keys configured, yet a request was refused")
	}
}

// TestGuardMatcherPolicyMetricsAgree sends, through a real in-process
// Caddy (guard, body matcher on the model, the ramjet policy, the observe
// handler and its metrics), the bodies on which the guard's former scanner
// and the parser disagreed: an escaped "model" key, an escaped '/' in the
// model name, a body nested 300 deep; and the ones that must be refused: a
// body nested deeper than selection.MaxDepth and messages as a string.
// Guard, matcher, policy and metrics must all see the decoded name org/m1,
// every accepted request must be routed by ramjet (never the fallback),
// and every request costs one parse.
func TestGuardMatcherPolicyMetricsAgree(t *testing.T) {
	ss := startSims(t, 2, enginesimOptions("org/m1"))
	ups := strings.Join(ss.dials(), " ")
	c := startCaddyfile(t, `{
	admin {ADMIN}
}
http://{ADDR} {
	route {
		ramjet_observe
		ramjet_guard `+ups+`
		@org ramjet_body org/*
		reverse_proxy @org `+ups+` {
			lb_policy ramjet
		}
		respond "no match" 404
	}
}
`)
	resetMetrics()
	m := processMetrics()
	msgs := `"messages":[{"role":"system","content":"` + longText("agree", 2000) + `"},{"role":"user","content":"hi"}],"max_tokens":4`
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		name, body string
		wantStatus int
		wantCode   string
	}{
		{"escaped key", `{"\u006dodel":"org/m1",` + msgs + `}`, 200, ""},
		{"escaped slash", `{"model":"org\u002fm1",` + msgs + `}`, 200, ""},
		{"300 deep", `{"model":"org/m1",` + msgs + `,"metadata_x":` + nest(300) + `}`, 200, ""},
		{"escaped key, other model", `{"\u006dodel":"org\u002fother",` + msgs + `}`, 404, edge.CodeModelNotFound},
		{"too deep", `{"model":"org/m1",` + msgs + `,"x":` + nest(selection.MaxDepth) + `}`, 400, edge.CodeInvalidJSON},
		{"messages as a string", `{"model":"org/m1","messages":"hi"}`, 400, edge.CodeInvalidType},
	}
	parses := bodyParses.Load()
	ids := map[string]bool{}
	for _, tt := range tests {
		resp, body := c.post("/v1/chat/completions", tt.body)
		if resp.StatusCode != tt.wantStatus {
			t.Fatalf("%s: status %d, want %d: %s", tt.name, resp.StatusCode, tt.wantStatus, body)
		}
		if tt.wantStatus != 200 {
			we := decodeWireError(t, body)
			if we.Error.Code == nil || *we.Error.Code != tt.wantCode {
				t.Errorf("%s: code %v, want %s: %s", tt.name, we.Error.Code, tt.wantCode, body)
			}
			continue
		}
		id := resp.Header.Get(HeaderUpstream)
		if id == "" || ss.byRouteID(id) < 0 {
			t.Fatalf("%s: routed to %q, not one of the engines", tt.name, id)
		}
		ids[id] = true
	}
	if got := bodyParses.Load() - parses; got != int64(len(tests)) {
		t.Errorf("%d parses for %d requests, want one each", got, len(tests))
	}
	eventually(t, "requests accounted", func() bool {
		n := 0.0
		for id := range ids {
			n += requestsTotal(m, id, "org/m1", metrics.OutcomeOK)
		}
		return n == 3
	})
	for id := range ids {
		if got := seriesValue(m, "routing_decisions_total", "upstream", id, "reason", "fallback"); got != 0 {
			t.Errorf("%v requests on %s went to the fallback policy", got, id)
		}
	}
	for _, rec := range processMetrics().RecentRecords() {
		if rec.Upstream != "" && (rec.Model != "org/m1" || rec.Reason == "fallback") {
			t.Errorf("dashboard record %+v, want model org/m1 routed by ramjet", rec)
		}
	}
	// The matcher compares the decoded name: a glob that only the raw bytes
	// would match does not match.
	resp, body := c.post("/v1/chat/completions", `{"model":"org\u002fm1","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 200 {
		t.Errorf("decoded name not matched by org/*: %d %s", resp.StatusCode, body)
	}
}

func enginesimOptions(model string) enginesim.Options {
	return enginesim.Options{Model: model, Instant: true}
}

func TestGuardNormalizesPaths(t *testing.T) {
	g := newTestGuard(t, &Guard{GuardSettings: edge.GuardSettings{AllowPaths: []string{"/tokenize", "/v1/audio/*"}}})
	tests := []struct {
		in, want string // want "" = refused
	}{
		{"/v1/chat/completions", "/v1/chat/completions"},
		{"//v1/chat/completions", "/v1/chat/completions"},
		{"/v1/x/../chat/completions", "/v1/chat/completions"},
		{"/V1/CHAT/COMPLETIONS", "/v1/chat/completions"},
		{"/v1/./completions/", "/v1/completions"},
		{"/v1/models/m1", "/v1/models/m1"},
		{"/Tokenize", "/tokenize"},
		{"/v1/audio/speech", "/v1/audio/speech"},
		{"/v1/audio", ""},
		{"/v1/audio/../../metrics", ""},
		{"/metrics", ""},
		{"/reset_prefix_cache", ""},
		{"/v1/chat/completions2", ""},
		{"/", ""},
	}
	for _, tt := range tests {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL.Path = tt.in
		ok := g.allow.Allow(req)
		if ok != (tt.want != "") || (ok && req.URL.Path != tt.want) {
			t.Errorf("%s: allowed %v, path %q; want %q", tt.in, ok, req.URL.Path, tt.want)
		}
	}
	if err := (&Guard{GuardSettings: edge.GuardSettings{AllowPaths: []string{"/a*"}}}).Validate(); err == nil {
		t.Error("allow_paths /a* accepted")
	}
	if err := (&Guard{GuardSettings: edge.GuardSettings{AllowPaths: []string{"tokenize"}}}).Validate(); err == nil {
		t.Error("allow_paths without a leading / accepted")
	}
}

// statusLog records each status written and whether the header then named
// an upstream address.
type statusLog struct {
	*httptest.ResponseRecorder
	dial   string
	status []int
	leaked bool
}

func (w *statusLog) WriteHeader(status int) {
	w.status = append(w.status, status)
	for _, vs := range w.Header() {
		for _, v := range vs {
			w.leaked = w.leaked || strings.Contains(v, w.dial)
		}
	}
	w.ResponseRecorder.WriteHeader(status)
}

// TestGuardAndHandlerShareOneWriter: in either order (the handler in
// front, as the ramjet directive emits them, or the guard in front) the
// guard and the handler write through one observe.Writer, and the response
// is what their two writers made of it: headers naming an upstream scrubbed
// on 1xx and final statuses, a second final status dropped, the observers
// told of the guard's error answer only when it is written before they end
// (the handler in front).
func TestGuardAndHandlerShareOneWriter(t *testing.T) {
	g := newTestGuard(t, &Guard{})
	dial := g.Upstreams[0]
	for _, guardFirst := range []bool{false, true} {
		for _, fail := range []bool{false, true} {
			var seen, want http.ResponseWriter
			var seenReq *http.Request
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				seen, seenReq, want = w, r, &lookupRequest(r).obsv.w // while the request runs
				if fail {
					return caddyhttp.Error(http.StatusBadGateway, errors.New("dial tcp "+dial+": connection refused"))
				}
				h := w.Header()
				h.Set("Link", "<http://"+dial+"/x>")
				w.WriteHeader(http.StatusEarlyHints)
				h.Set("Location", "http://"+dial+"/v1/x")
				h.Set("X-Kept", "yes")
				w.WriteHeader(http.StatusOK)
				w.WriteHeader(http.StatusInternalServerError) // dropped
				_, _ = io.WriteString(w, "ok")
				return nil
			})
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m1"}`))
			req.Header.Set("X-Test-Observe", "1")
			ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer())
			req = req.WithContext(context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{}))
			rec := &statusLog{ResponseRecorder: httptest.NewRecorder(), dial: dial}
			h := Handler{extra: recordObserver, set: processMetrics()}
			var err error
			if guardFirst {
				err = g.ServeHTTP(rec, req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
					return h.ServeHTTP(w, r, next)
				}))
			} else {
				err = h.ServeHTTP(rec, req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
					return g.ServeHTTP(w, r, next)
				}))
			}
			o := testObservers[seenReq]
			delete(testObservers, seenReq)
			if seen != want {
				t.Errorf("guard first %v: the upstream wrote through %T %p, want the one writer %p", guardFirst, seen, seen, want)
			}
			if err != nil || rec.leaked || o == nil || !o.ended {
				t.Fatalf("guard first %v, fail %v: err %v, leaked %v, observer %+v", guardFirst, fail, err, rec.leaked, o)
			}
			switch {
			case !fail:
				if len(rec.status) != 2 || rec.status[0] != 103 || rec.status[1] != 200 || rec.Body.String() != "ok" ||
					rec.Header().Get("X-Kept") != "yes" || o.status != 200 || string(o.body) != "ok" {
					t.Errorf("guard first %v: statuses %v, body %q, header %v, observer %+v", guardFirst, rec.status, rec.Body, rec.Header(), o)
				}
			case guardFirst:
				if len(rec.status) != 1 || rec.status[0] != 502 || o.status != 0 || len(o.body) != 0 {
					t.Errorf("guard first, failed: statuses %v, observer %+v (it ended before the guard's answer)", rec.status, o)
				}
			default:
				if len(rec.status) != 1 || rec.status[0] != 502 || o.status != 502 || !bytes.Contains(o.body, []byte(`"error"`)) {
					t.Errorf("handler first, failed: statuses %v, observer %+v (it sees the guard's answer)", rec.status, o)
				}
			}
		}
	}
}
