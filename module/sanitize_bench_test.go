package module

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// BenchmarkProbeModel measures the guard's JSON check and model probe by
// body size (the rest of the guard is header edits and one body copy).
func BenchmarkProbeModel(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		body := []byte(`{"model":"qwen3-32b","messages":[{"role":"system","content":"` +
			strings.Repeat("You are a helpful assistant. ", size/29) + `"},{"role":"user","content":"hi"}],"max_tokens":64}`)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, ae := probeModel(body); ae != nil {
					b.Fatal(ae)
				}
			}
		})
	}
}

// BenchmarkGuard measures the whole guard on one request: header edits,
// the bounded body read into the request state, the JSON check and the
// known-model lookup, with a next handler that does nothing.
func BenchmarkGuard(b *testing.B) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"data":[{"id":"qwen3-32b"}]}`)
	}))
	defer engine.Close()
	g := &Guard{Upstreams: []string{strings.TrimPrefix(engine.URL, "http://")}, UpstreamToken: "t"}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := g.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	defer g.Cleanup()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		body := []byte(`{"model":"qwen3-32b","messages":[{"role":"system","content":"` +
			strings.Repeat("You are a helpful assistant. ", size/29) + `"},{"role":"user","content":"hi"}],"max_tokens":64}`)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			w := httptest.NewRecorder()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Authorization", "Bearer client")
				c := context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{})
				r = r.WithContext(c)
				if err := g.ServeHTTP(w, r, next); err != nil {
					b.Fatal(err)
				}
				if st := lookupRequest(r); st != nil {
					st.finish()
					st.stop()
				}
			}
		})
	}
}

// BenchmarkProbeModelStdlib is the encoding/json baseline the scanner
// replaced (json.Unmarshal into a struct with only the model field).
func BenchmarkProbeModelStdlib(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		body := []byte(`{"model":"qwen3-32b","messages":[{"role":"system","content":"` +
			strings.Repeat("You are a helpful assistant. ", size/29) + `"},{"role":"user","content":"hi"}],"max_tokens":64}`)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var probe struct {
					Model json.RawMessage `json:"model"`
				}
				if err := json.Unmarshal(body, &probe); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
