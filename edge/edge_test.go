package edge

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Encoding", "gzip")
	Write(rec, NewError(http.StatusNotFound, TypeInvalidRequest, CodeModelNotFound, "model", "The model `x` does not exist."))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status = %d, want 404", rec.Code)
	}
	if got := rec.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := rec.Header().Get("Content-Encoding"); got != "" {
		t.Errorf("Content-Encoding kept: %q", got)
	}
	want := `{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}` + "\n"
	if diff := cmp.Diff(want, rec.Body.String()); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	var we struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &we); err != nil || len(we.Error) != 4 {
		t.Errorf("error body %s: %v", rec.Body.Bytes(), err)
	}
}

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
	StripRequestHeaders(h)
	want := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"abc"}}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
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
		if got := IsJSONContent(give); got != want {
			t.Errorf("IsJSONContent(%q) = %v, want %v", give, got, want)
		}
	}
}

func TestScrubList(t *testing.T) {
	got := ScrubList([]string{"127.0.0.1:8005", "https://engine.internal:443", "vllm:8000", "127.0.0.1:8005"})
	want := []string{"127.0.0.1:8005", "127.0.0.1", "engine.internal:443", "engine.internal", "vllm:8000"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ScrubList (-want +got):\n%s", diff)
	}
}

// TestReduceScrub: the reduced list keeps the entries no other contains,
// and ScrubHeaders removes the same headers with it as with the full list.
func TestReduceScrub(t *testing.T) {
	full := ScrubList([]string{"127.0.0.1:8005", "127.0.0.1:8006", "https://engine.internal:443", "vllm:8000", "sglang:80", "sglang:8080"})
	got := ReduceScrub(full)
	want := []string{"127.0.0.1", "engine.internal", "vllm:8000", "sglang:80"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReduceScrub (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a"}, ReduceScrub([]string{"a", "a", "ab"})); diff != "" {
		t.Errorf("ReduceScrub with duplicates (-want +got):\n%s", diff)
	}
	values := []string{"", "ok", "127.0.0.1", "http://127.0.0.1:8005/x", "via 127.0.0", "engine.internal:443",
		"ENGINE.INTERNAL", "vllm:8000", "vllm:8001", "sglang:8080", "sglang:80", "sglang:81", "x, sglang:8080"}
	for _, v := range values {
		for _, w := range values {
			h1 := http.Header{"A": {v}, "B": {"ok", w}, "C": {"ok"}}
			h2 := http.Header{"A": {v}, "B": {"ok", w}, "C": {"ok"}}
			ScrubHeaders(h1, full)
			ScrubHeaders(h2, got)
			if diff := cmp.Diff(h1, h2); diff != "" {
				t.Fatalf("values %q, %q: full list vs reduced (-full +reduced):\n%s", v, w, diff)
			}
		}
	}
}

func TestNormalizePath(t *testing.T) {
	for give, want := range map[string]string{
		"":                             "/",
		"/":                            "/",
		"//":                           "/",
		"//v1/chat/completions":        "/v1/chat/completions",
		"/v1/x/../chat/completions":    "/v1/chat/completions",
		"/V1/CHAT/COMPLETIONS/":        "/v1/chat/completions",
		"/v1/./models//m1/":            "/v1/models/m1",
		"/../../etc/passwd":            "/etc/passwd",
		"v1/models":                    "v1/models",
		"/v1/chat/completions/../../x": "/v1/x",
	} {
		if got := NormalizePath(give); got != want {
			t.Errorf("NormalizePath(%q) = %q, want %q", give, got, want)
		}
	}
}

// TestAllowListExactNormalised: Allow's shortcut (a path found as it is
// among the exact paths is served unchanged) is what the normalising path
// gives: every exact path is its own normalisation, with extra paths in
// any spelling, and spellings that normalise to one are rewritten to it.
func TestAllowListExactNormalised(t *testing.T) {
	a := NewAllowList([]string{"/Tokenize/", "/v1/audio//speech", "/v1/x/*"})
	for p := range a.exact {
		if n := NormalizePath(p); n != p {
			t.Errorf("exact path %q normalises to %q", p, n)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"/v1/chat/completions", "/v1/chat/completions"},
		{"/V1/Chat/Completions", "/v1/chat/completions"},
		{"/tokenize", "/tokenize"},
		{"/v1/audio/speech", "/v1/audio/speech"},
		{"/v1//models/../models", "/v1/models"},
		{"/v1/x/y", "/v1/x/y"},
	} {
		r := httptest.NewRequest(http.MethodGet, "http://h"+tt.in, nil)
		if !a.Allow(r) {
			t.Errorf("%q not allowed", tt.in)
			continue
		}
		if r.URL.Path != tt.want {
			t.Errorf("%q served as %q, want %q", tt.in, r.URL.Path, tt.want)
		}
	}
}

// TestHeaderValue holds HeaderValue to Header.Get for canonical keys.
func TestHeaderValue(t *testing.T) {
	h := http.Header{}
	h.Add("Content-Type", "application/json")
	h.Add("Content-Type", "text/plain")
	h["Content-Encoding"] = []string{}
	for _, k := range []string{"Content-Type", "Content-Encoding", "X-Missing"} {
		if got, want := HeaderValue(h, k), h.Get(k); got != want {
			t.Errorf("HeaderValue(%q) = %q, Get = %q", k, got, want)
		}
	}
}

// TestSetValues sets a header's values as given (shared, not copied),
// removes it for nil values and leaves a nil header alone.
func TestSetValues(t *testing.T) {
	h := http.Header{"X-Data-Parallel-Rank": {"1"}, "Accept": {"*/*"}}
	rank := []string{"3"}
	SetValues(h, "X-Data-Parallel-Rank", rank)
	if got := h["X-Data-Parallel-Rank"]; len(got) != 1 || &got[0] != &rank[0] {
		t.Fatalf("set: got %v, want the shared slice %v", got, rank)
	}
	SetValues(h, "X-Data-Parallel-Rank", nil)
	if _, ok := h["X-Data-Parallel-Rank"]; ok || len(h) != 1 || h.Get("Accept") != "*/*" {
		t.Fatalf("nil values: got %v, want the name removed and Accept kept", h)
	}
	SetValues(nil, "X-Data-Parallel-Rank", rank) // no panic
}

// TestStripRequestHeadersReference holds StripRequestHeaders' one pass to
// the deletes it replaced (each hop-by-hop name in canonical form deleted
// from the map), over every hop-by-hop name in canonical and other
// spellings, beside ordinary and X-Ramjet-* names.
func TestStripRequestHeadersReference(t *testing.T) {
	hop := []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade"}
	reference := func(h http.Header) {
		for _, v := range h["Connection"] {
			for name := range strings.SplitSeq(v, ",") {
				if name = strings.TrimSpace(name); name != "" {
					h.Del(name)
				}
			}
		}
		for _, name := range hop {
			delete(h, name)
		}
		for name := range h {
			if strings.HasPrefix(strings.ToLower(name), "x-ramjet-") || strings.EqualFold(name, "X-Data-Parallel-Rank") {
				delete(h, name)
			}
		}
	}
	var names []string
	for _, n := range hop {
		names = append(names, n, strings.ToLower(n), strings.ToUpper(n))
	}
	names = append(names, "Content-Type", "X-Request-Id", "X-Ramjet-Upstream", "x-ramjet-a", "X-Data-Parallel-Rank",
		"x-data-parallel-rank", "Te-X", "Upgrades", "X-Private", "Authorization")
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		h := http.Header{}
		for _, n := range names {
			if rng.IntN(3) == 0 {
				h[n] = []string{"v"}
			}
		}
		if rng.IntN(4) == 0 {
			h["Connection"] = []string{"keep-alive, X-Private"}
		}
		if rng.IntN(8) == 0 {
			h["Connection"] = []string{"close, content-type"}
		}
		want := h.Clone()
		reference(want)
		_, ct := StripRequestHeaders(h)
		if diff := cmp.Diff(want, h); diff != "" {
			t.Fatalf("case %d (-reference +got):\n%s", i, diff)
		}
		if ct != HeaderValue(want, "Content-Type") {
			t.Fatalf("case %d: content type %q, want %q", i, ct, HeaderValue(want, "Content-Type"))
		}
	}
}

// TestIsAPIPOSTRoute: exactly the four default API routes (a switch since
// 2026-12-06; it was a map of these four), normalised form only.
func TestIsAPIPOSTRoute(t *testing.T) {
	want := map[string]bool{"/v1/chat/completions": true, "/v1/completions": true, "/v1/responses": true, "/v1/embeddings": true}
	for p := range jsonRoutes {
		for _, q := range []string{p, p + "/", strings.ToUpper(p), "/x" + p, p[:len(p)-1]} {
			if got := IsAPIPOSTRoute(q); got != want[q] {
				t.Errorf("IsAPIPOSTRoute(%q) = %v, want %v", q, got, want[q])
			}
		}
	}
	for p := range want {
		if !IsAPIPOSTRoute(p) || !jsonRoutes[p] {
			t.Errorf("%q: IsAPIPOSTRoute %v, a JSON route %v", p, IsAPIPOSTRoute(p), jsonRoutes[p])
		}
	}
	if IsAPIPOSTRoute("") || IsAPIPOSTRoute("/") {
		t.Error("empty or root path is an API route")
	}
	// Allow answers the API routes before its map: each must be in every
	// list's exact set, extras or not.
	for _, extra := range [][]string{nil, {"/metrics"}, {"/v1/*"}} {
		a := NewAllowList(extra)
		for p := range want {
			if !a.exact[p] {
				t.Errorf("allow list with %v: API route %q not in its exact set", extra, p)
			}
		}
	}
}
