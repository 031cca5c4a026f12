package module

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{ h http.Header }

func (w discardWriter) Header() http.Header         { return w.h }
func (w discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w discardWriter) WriteHeader(int)             {}

// BenchmarkHandlerServe is ramjet_observe's cost for one short streamed
// response that no policy routed (request setup included): the
// observers' creation, every Write and the end.
func BenchmarkHandlerServe(b *testing.B) {
	chunks := [][]byte{[]byte("data: {\"choices\":[]}\n\n"), []byte("data: [DONE]\n\n")}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, c := range chunks {
			_, _ = w.Write(c)
		}
		return nil
	})
	w := discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodGet, "/v1/models", strings.NewReader(""))
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
		clear(w.h)
		if err := (Handler{set: processMetrics()}).ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
	}
}
