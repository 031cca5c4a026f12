package module

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ramjet-llm/ramjet/edge"
)

// recordingEngine is an OpenAI-compatible engine on 127.0.0.1 that records
// every request other than the model listing (which health checks and the
// guard's model fetch send), so that a test can say what reached it.
type recordingEngine struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []recorded
}

type recorded struct {
	method, path string
	header       http.Header
	trailer      http.Header
}

func startRecordingEngine(t *testing.T) *recordingEngine {
	t.Helper()
	e := &recordingEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m1","object":"model"}]}`)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body) // trailers are read with the body
		e.mu.Lock()
		e.got = append(e.got, recorded{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), trailer: r.Trailer.Clone()})
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *recordingEngine) dial() string { return strings.TrimPrefix(e.srv.URL, "http://") }

// take returns and forgets what the engine received.
func (e *recordingEngine) take() []recorded {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.got
	e.got = nil
	return out
}

const okChat = `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`

// TestEdgeOnlyTheAPI: through deploy/Caddyfile, only the OpenAI routes
// reach the engine (after path normalisation, with the upstream token);
// engine-internal routes are an OpenAI-shaped 404 the engine never sees;
// RJ_ALLOW_PATHS opens more. Issue 15, items 2 and 7.
func TestEdgeOnlyTheAPI(t *testing.T) {
	eng := startRecordingEngine(t)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":       eng.dial(),
		"RJ_UPSTREAM_TOKEN": "up-secret",
		"RJ_ALLOW_PATHS":    "/tokenize,/v1/audio/*",
	})
	tests := []struct {
		name, method, path, ctype, body string
		wantStatus                      int
		wantCode                        string // OpenAI error code when refused
		wantParam                       string
		wantPath                        string // what the engine saw; "" = nothing
	}{
		{"reset prefix cache", "POST", "/reset_prefix_cache", "", "", 404, edge.CodeUnknownURL, "", ""},
		{"simulator faults", "PUT", "/sim/faults", "application/json", `{"fail":1}`, 404, edge.CodeUnknownURL, "", ""},
		{"engine metrics", "GET", "/metrics", "", "", 404, edge.CodeUnknownURL, "", ""},
		{"sglang flush", "POST", "/flush_cache", "", "", 404, edge.CodeUnknownURL, "", ""},
		{"sleep", "POST", "/sleep", "", "", 404, edge.CodeUnknownURL, "", ""},
		{"dot segments to metrics", "GET", "/v1/../metrics", "", "", 404, edge.CodeUnknownURL, "", ""},
		{"api prefix is not the api", "POST", "/v1/chat/completions/../../../reset_prefix_cache", "", "", 404, edge.CodeUnknownURL, "", ""},
		{"root", "GET", "/", "", "", 404, edge.CodeUnknownURL, "", ""},
		{"chat", "POST", "/v1/chat/completions", "application/json", okChat, 200, "", "", "/v1/chat/completions"},
		{"double slash", "POST", "//v1/chat/completions", "application/json", okChat, 200, "", "", "/v1/chat/completions"},
		{"dot segment", "POST", "/v1/x/../chat/completions", "application/json", okChat, 200, "", "", "/v1/chat/completions"},
		{"upper case", "POST", "/V1/CHAT/COMPLETIONS", "application/json", okChat, 200, "", "", "/v1/chat/completions"},
		{"trailing slash", "POST", "/v1/chat/completions/", "application/json", okChat, 200, "", "", "/v1/chat/completions"},
		{"upper case not json", "POST", "/V1/CHAT/COMPLETIONS", "text/plain", okChat, 415, edge.CodeUnsupportedMedia, "", ""},
		{"text/plain", "POST", "/v1/chat/completions", "text/plain", okChat, 415, edge.CodeUnsupportedMedia, "", ""},
		{"multipart", "POST", "/v1/completions", "multipart/form-data; boundary=x", "--x--", 415, edge.CodeUnsupportedMedia, "", ""},
		{"form", "POST", "/v1/embeddings", "application/x-www-form-urlencoded", `{"model":"m1","input":"x"}`, 415, edge.CodeUnsupportedMedia, "", ""},
		{"messages as a string", "POST", "/v1/chat/completions", "application/json", `{"model":"m1","messages":"hi"}`, 400, edge.CodeInvalidType, "messages", ""},
		{"double slash, bad model", "POST", "//v1/chat/completions", "application/json", `{"model":"nope","messages":[]}`, 404, edge.CodeModelNotFound, "model", ""},
		{"allowed extra path", "POST", "/tokenize", "application/json", `{"model":"m1","prompt":"x"}`, 200, "", "", "/tokenize"},
		{"allowed extra prefix", "POST", "/v1/audio/transcriptions", "multipart/form-data; boundary=x", "--x--", 200, "", "", "/v1/audio/transcriptions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng.take()
			req, err := http.NewRequest(tt.method, p.base+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if tt.ctype != "" {
				req.Header.Set("Content-Type", tt.ctype)
			}
			req.Header.Set("Authorization", "Bearer client-key")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", resp.StatusCode, tt.wantStatus, body)
			}
			got := eng.take()
			if tt.wantPath == "" {
				if len(got) != 0 {
					t.Fatalf("the engine received %d request(s), first %s %s", len(got), got[0].method, got[0].path)
				}
				we := decodeWireError(t, body)
				if we.Error.Code == nil || *we.Error.Code != tt.wantCode {
					t.Errorf("code = %v, want %s; body %s", we.Error.Code, tt.wantCode, body)
				}
				if tt.wantParam != "" && (we.Error.Param == nil || *we.Error.Param != tt.wantParam) {
					t.Errorf("param = %v, want %s", we.Error.Param, tt.wantParam)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("the engine received %d requests, want 1", len(got))
			}
			if got[0].path != tt.wantPath {
				t.Errorf("engine path = %q, want %q", got[0].path, tt.wantPath)
			}
			if a := got[0].header.Get("Authorization"); a != "Bearer up-secret" {
				t.Errorf("engine Authorization = %q, want the upstream token", a)
			}
		})
	}
}

// TestEdgeHeaders: request trailers never reach the engine, and X-Api-Key
// is a client credential: checked like api-key and never forwarded.
// Issue 15, item 8.
func TestEdgeHeaders(t *testing.T) {
	eng := startRecordingEngine(t)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":      eng.dial(),
		"RJ_CLIENT_TOKENS": "k1,k2",
	})
	send := func(t *testing.T, hdr map[string]string, trailer map[string]string) int {
		t.Helper()
		eng.take()
		var body io.Reader = strings.NewReader(okChat)
		if trailer != nil {
			body = io.MultiReader(strings.NewReader(okChat)) // no length: chunked, so trailers are sent
		}
		req, err := http.NewRequest("POST", p.base+"/v1/chat/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if trailer != nil {
			req.ContentLength = -1
			req.Trailer = http.Header{}
			for k, v := range trailer {
				req.Trailer.Set(k, v)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	tests := []struct {
		name       string
		hdr        map[string]string
		trailer    map[string]string
		wantStatus int
	}{
		{"x-api-key accepted", map[string]string{"X-Api-Key": "k2"}, nil, 200},
		{"x-api-key wrong", map[string]string{"X-Api-Key": "nope"}, nil, 401},
		{"no key", nil, nil, 401},
		{"bearer", map[string]string{"Authorization": "Bearer k1"}, nil, 200},
		{"rank trailer", map[string]string{"Authorization": "Bearer k1"}, map[string]string{"X-Data-Parallel-Rank": "3", "X-Other": "t"}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := send(t, tt.hdr, tt.trailer); got != tt.wantStatus {
				t.Fatalf("status = %d, want %d", got, tt.wantStatus)
			}
			got := eng.take()
			if tt.wantStatus != 200 {
				if len(got) != 0 {
					t.Fatalf("a refused request reached the engine")
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("the engine received %d requests, want 1", len(got))
			}
			r := got[0]
			for _, h := range []string{"X-Api-Key", "Api-Key", "Authorization"} {
				if r.header.Get(h) != "" {
					t.Errorf("%s forwarded to the engine: %q", h, r.header.Get(h))
				}
			}
			if len(r.trailer) != 0 || r.header.Get("Trailer") != "" {
				t.Errorf("trailers reached the engine: %v (Trailer header %q)", r.trailer, r.header.Get("Trailer"))
			}
			if v := r.header.Get("X-Data-Parallel-Rank"); v == "3" {
				t.Errorf("the client's rank reached the engine")
			}
		})
	}
}

// TestEdgeOpsToken: RJ_METRICS_TOKEN guards the ops port; without it the
// port stays open. Issue 15, item 4.
func TestEdgeOpsToken(t *testing.T) {
	eng := startRecordingEngine(t)
	for _, tt := range []struct {
		name, token, send string
		want              int
	}{
		{"no token set", "", "", 200},
		{"token missing", "ops-s3cret", "", 401},
		{"token wrong", "ops-s3cret", "Bearer nope", 401},
		{"token right", "ops-s3cret", "Bearer ops-s3cret", 200},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"RJ_UPSTREAM": eng.dial()}
			if tt.token != "" {
				env["RJ_METRICS_TOKEN"] = tt.token
			}
			p := mustLoad(t, deployCaddyfile(t), env)
			req, err := http.NewRequest("GET", p.metrics+"/metrics", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.send != "" {
				req.Header.Set("Authorization", tt.send)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("status = %d, want %d; body %.200s", resp.StatusCode, tt.want, body)
			}
			if tt.want == 401 {
				decodeWireError(t, body)
			}
		})
	}
}
