package module

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/google/go-cmp/cmp"
)

func TestStripRequestHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("X-Ramjet-Upstream", "forged")
	h.Set("X-Ramjet-Debug", "1")
	h["x-ramjet-lower"] = []string{"raw"}
	h.Set("X-Data-Parallel-Rank", "3")
	h.Set("Connection", "keep-alive, X-Private")
	h.Set("X-Private", "secret")
	h.Set("Keep-Alive", "timeout=5")
	h.Set("Proxy-Authorization", "Basic abc")
	h.Set("Te", "trailers")
	h.Set("Upgrade", "h2c")
	h.Set("Content-Type", "application/json")
	h.Set("X-Request-Id", "abc")
	stripRequestHeaders(h)
	want := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"abc"}}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}
}

func TestProbeModel(t *testing.T) {
	tests := []struct {
		name      string
		give      string
		wantModel string
		wantErr   string
	}{
		{"model", `{"model":"m1","messages":[]}`, "m1", ""},
		{"no model", `{"messages":[]}`, "", ""},
		{"null model", `{"model":null}`, "", ""},
		{"escaped", `{"model":"a\u002fb"}`, "a/b", ""},
		{"truncated", `{"model":"m1","messages":[`, "", "not valid JSON"},
		{"garbage", `model=m1`, "", "not valid JSON"},
		{"array", `[1,2]`, "", "must be a JSON object"},
		{"string", `"hi"`, "", "must be a JSON object"},
		{"number model", `{"model":7}`, "", "model must be a string"},
		{"trailing", `{"model":"m"} x`, "", "not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			model, ae := probeModel([]byte(tt.give))
			if tt.wantErr != "" {
				if ae == nil || !strings.Contains(ae.Message, tt.wantErr) || ae.Status != 400 {
					t.Fatalf("probeModel() error = %v, want 400 containing %q", ae, tt.wantErr)
				}
				return
			}
			if ae != nil {
				t.Fatalf("unexpected error %v", ae)
			}
			if model != tt.wantModel {
				t.Errorf("model = %q, want %q", model, tt.wantModel)
			}
		})
	}
}

func TestIsJSONContent(t *testing.T) {
	for give, want := range map[string]bool{
		"":                                true,
		"application/json":                true,
		"application/json; charset=utf-8": true,
		"application/vnd.api+json":        true,
		"multipart/form-data; boundary=x": false,
		"text/plain":                      false,
	} {
		if got := isJSONContent(give); got != want {
			t.Errorf("isJSONContent(%q) = %v, want %v", give, got, want)
		}
	}
}

func TestScrubList(t *testing.T) {
	got := scrubList([]string{"127.0.0.1:8005", "https://engine.internal:443", "vllm:8000", "127.0.0.1:8005"})
	want := []string{"127.0.0.1:8005", "127.0.0.1", "engine.internal:443", "engine.internal", "vllm:8000"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("scrubList (-want +got):\n%s", diff)
	}
}

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
	g := newTestGuard(t, &Guard{MaxBodySize: 64})
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
		{"malformed", "/v1/chat/completions", `{"model":`, "application/json", 400, errCodeInvalidJSON},
		{"too large", "/v1/completions", `{"model":"m1","prompt":"` + strings.Repeat("x", 80) + `"}`, "application/json", 413, errCodeBodyTooLarge},
		{"unknown model", "/v1/chat/completions", `{"model":"nope"}`, "application/json", 404, errCodeModelNotFound},
		{"multipart not parsed", "/v1/chat/completions", `--x--`, "multipart/form-data; boundary=x", 200, ""},
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
	g := newTestGuard(t, &Guard{MaxBodySize: 16})
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
		{"token replaces client auth", &Guard{UpstreamToken: "up-tok"}, "Bearer up-tok"},
		{"client auth dropped by default", &Guard{}, ""},
		{"client auth forwarded on request", &Guard{ForwardClientAuth: true}, "Bearer client"},
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
				if st := lookupRequest(r); st == nil || st.body == nil || !bytes.Equal(st.body.buf, []byte(body)) {
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
	req = httptest.NewRequest(http.MethodGet, "/v1/other", nil)
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

// FuzzProbeModel checks the one-pass scanner against encoding/json: the same
// bodies are valid, and the same model is found.
func FuzzProbeModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"m1","messages":[{"role":"user","content":"hi \u00e9 \n"}]}`,
		`{"model":"a\u002fb","x":[1,-2.5e+3,true,false,null,{}]}`,
		`{"\u006dodel":"esc-key"}`, `{"model":null}`, `{"model":3}`, `{"model":"x","model":"y"}`,
		`[1]`, `"s"`, `{`, `{"a":}`, `{"a":01}`, `{"a":1.}`, `{"a":"\x"}`, `{"a":"` + "\x01" + `"}`,
		` {"a":[[[]]]} `, `{"a":1} {}`, `{"a":-}`, `{"a":1e}`, `{"a":tru}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkProbeAgainstStdlib(t, body) })
}

// TestProbeModelMutations runs the FuzzProbeModel check over a bounded,
// deterministic set of mutations of its seeds (the fuzzer proper needs
// -fuzz).
func TestProbeModelMutations(t *testing.T) {
	seeds := []string{
		`{"model":"m1","messages":[{"role":"user","content":"hi \u00e9 \n"}],"max_tokens":16,"temperature":0.7}`,
		`{"model":"a\u002fb","x":[1,-2.5e+3,true,false,null,{"y":"z"}]}`,
		`{"\u006dodel":"esc-key","n":[[1],[2,[3]]]}`,
	}
	const alphabet = "{}[]\",:\\u0123456789.-+eEtrufalsn \t\n\x01\xff"
	rng := uint64(0x9e3779b97f4a7c15)
	next := func(n int) int {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return int(rng % uint64(n))
	}
	for i := range 30000 {
		b := []byte(seeds[i%len(seeds)])
		for range 1 + next(3) {
			switch pos := next(len(b) + 1); next(3) {
			case 0: // replace
				if pos < len(b) {
					b[pos] = alphabet[next(len(alphabet))]
				}
			case 1: // insert
				b = append(b[:pos], append([]byte{alphabet[next(len(alphabet))]}, b[pos:]...)...)
			default: // truncate
				b = b[:pos]
			}
		}
		checkProbeAgainstStdlib(t, b)
	}
}

func checkProbeAgainstStdlib(t *testing.T, body []byte) {
	t.Helper()
	{
		model, ae := probeModel(body)
		// Keys match exactly (as the engines' parsers do), so the oracle is
		// a map, not a struct (encoding/json matches fields case-insensitively).
		var obj map[string]json.RawMessage
		valid := json.Valid(body)
		isObject := valid && json.Unmarshal(body, &obj) == nil && obj != nil
		probe := struct{ Model json.RawMessage }{obj["model"]}
		switch {
		case !valid:
			if ae == nil {
				t.Fatalf("invalid JSON accepted: %q", body)
			}
			return
		case !isObject:
			if ae == nil {
				t.Fatalf("non-object accepted: %q", body)
			}
			return
		}
		var want string
		wantErr := len(probe.Model) > 0 && string(probe.Model) != "null" && json.Unmarshal(probe.Model, &want) != nil
		if wantErr != (ae != nil) {
			t.Fatalf("probeModel(%q) error = %v, want error %v", body, ae, wantErr)
		}
		// encoding/json replaces invalid UTF-8; the probe keeps the bytes
		// (such a name matches no served model either way).
		if ae == nil && model != want && utf8.ValidString(model) {
			t.Fatalf("probeModel(%q) = %q, want %q", body, model, want)
		}
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
			ae := a.check(r)
			if (ae == nil) != tt.ok {
				t.Fatalf("check = %v, want ok %v", ae, tt.ok)
			}
			if ae != nil && (ae.Status != 401 || *ae.Code != "invalid_api_key") {
				t.Errorf("error = %+v", ae)
			}
		})
	}
	if newClientAuth("{env.RJ_TEST_UNSET_KEYS}").check(httptest.NewRequest(http.MethodGet, "/", nil)) != nil {
		t.Error("no keys configured, yet a request was refused")
	}
}
