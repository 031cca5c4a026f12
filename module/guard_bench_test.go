package module

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/selection"
)

// benchBody is a chat body of about size bytes: a long system prompt and
// a short question.
func benchBody(size int) []byte {
	return []byte(`{"model":"qwen3-32b","messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant. ", size/29) + `"},{"role":"user","content":"hi"}],"max_tokens":64}`)
}

func benchGuard(b testing.TB) *Guard {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"data":[{"id":"qwen3-32b"}]}`)
	}))
	b.Cleanup(engine.Close)
	g := &Guard{Engines: Engines{Upstreams: []string{strings.TrimPrefix(engine.URL, "http://")}, UpstreamToken: "t"}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	b.Cleanup(cancel)
	if err := g.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = g.Cleanup() })
	return g
}

// BenchmarkGuard measures the whole guard on one request: header edits,
// the bounded body read into the request state, the one parse and the
// known-model lookup, with a next handler that does nothing.
func BenchmarkGuard(b *testing.B) {
	g := benchGuard(b)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		body := benchBody(size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			w := httptest.NewRecorder()
			for b.Loop() {
				r := guardRequest(body)
				if err := g.ServeHTTP(w, r, next); err != nil {
					b.Fatal(err)
				}
				endRequest(r)
			}
		})
	}
}

func guardRequest(body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer client")
	c := context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{})
	return r.WithContext(c)
}

func endRequest(r *http.Request) {
	if st := lookupRequest(r); st != nil {
		st.finish()
	}
}

// BenchmarkGuardOneParse shows that the guard adds no second pass: "parse"
// is selection's Parse alone on the body; "guard+policy" is the guard
// followed by what the policy's Select does to get the features
// (st.features with the policy's extractor), per request. The difference
// is the request handling (the body copy, headers, the request state), not
// a second parse: bodyParses counts one per request.
func BenchmarkGuardOneParse(b *testing.B) {
	g := benchGuard(b)
	x := sharedExtractor()
	for _, size := range []int{64 << 10, 256 << 10} {
		body := benchBody(size)
		b.Run(fmt.Sprintf("%dKiB/parse", size>>10), func(b *testing.B) {
			f := x.NewFeatures()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := x.Parse(selection.EndpointChat, body, f); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("%dKiB/guard+policy", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			w := httptest.NewRecorder()
			parses := bodyParses.Load()
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				st := lookupRequest(r)
				bb := st.acquireBody()
				defer bb.Release()
				if st.features(x, selection.EndpointChat) == nil {
					b.Fatal("no features")
				}
				return nil
			})
			n := int64(0)
			for b.Loop() {
				r := guardRequest(body)
				if err := g.ServeHTTP(w, r, next); err != nil {
					b.Fatal(err)
				}
				endRequest(r)
				n++
			}
			if got := bodyParses.Load() - parses; got != n {
				b.Fatalf("%d parses for %d requests", got, n)
			}
		})
	}
}
