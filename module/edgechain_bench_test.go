package module

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// chainAnswer is what the engine stand-in answers: a chat completion with
// its usage object, as vLLM sends it.
var chainAnswer = []byte(`{"id":"chatcmpl-1","object":"chat.completion","model":"qwen3-32b","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}}`)

// chainEngine stands in for reverse_proxy and the engine: it reads and
// closes the request body (as the transport does), sets the headers an
// engine answer has and writes the answer in one chunk.
var chainEngine = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	if wt, ok := r.Body.(io.WriterTo); ok {
		_, _ = wt.WriteTo(io.Discard)
	} else {
		_, _ = io.Copy(io.Discard, r.Body)
	}
	_ = r.Body.Close()
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Date"] = []string{"Wed, 02 Dec 2026 01:00:00 GMT"}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(chainAnswer)
	return nil
})

// chainRequest is a request as Caddy hands it to the first handler: the
// vars map in a context that is canceled when the request ends. The
// request, its headers and vars are built once and reset for every
// iteration (serveChain); the context is new each time (three
// allocations, counted by the "harness" sub-benchmark), so that the
// request states end as they do in Caddy.
type chainRequest struct {
	base *http.Request
	r    *http.Request
	vars map[string]any
	body *replayBody
	hdr  http.Header
}

// replayBody is a request body that can be rewound without allocating.
type replayBody struct {
	b   []byte
	off int
}

func (rb *replayBody) Read(p []byte) (int, error) {
	if rb.off >= len(rb.b) {
		return 0, io.EOF
	}
	n := copy(p, rb.b[rb.off:])
	rb.off += n
	return n, nil
}

func (rb *replayBody) Close() error { return nil }

func newChainRequest(body []byte) *chainRequest {
	r := guardRequest(body)
	return &chainRequest{base: r, vars: map[string]any{}, body: &replayBody{b: body}, hdr: r.Header.Clone()}
}

// start makes the request as new (the original headers and body, empty
// vars, a new context) and returns the function that ends its context.
func (cr *chainRequest) start() context.CancelFunc {
	clear(cr.vars)
	clear(cr.base.Header)
	for k, v := range cr.hdr {
		cr.base.Header[k] = v
	}
	cr.body.off = 0
	cr.base.Body = cr.body
	cr.base.ContentLength = int64(len(cr.body.b))
	cr.base.Trailer = nil
	ctx, cancel := context.WithCancel(context.Background())
	cr.r = cr.base.WithContext(context.WithValue(ctx, caddyhttp.VarsCtxKey, cr.vars))
	return cancel
}

// BenchmarkEdgeChain is what ramjet adds to one request besides the
// policy's Select, as deploy/Caddyfile runs it: ramjet_guard (headers, the
// body deadline, the bounded body read, the one parse, the model check,
// the response header scrub) in front of ramjet_observe (the request
// state, the observers, the metrics and usage parse of the answer, the
// outlier outcome), over a stand-in for reverse_proxy that answers a chat
// completion with usage. The request itself is built once.
func BenchmarkEdgeChain(b *testing.B) {
	g := benchGuard(b)
	h := Handler{set: processMetrics()}
	b.Run("harness", func(b *testing.B) {
		benchHarness(b, newChainRequest(benchBody(1<<10)), &chainWriter{h: http.Header{}})
	})
	for _, size := range []int{1 << 10, 256 << 10} {
		body := benchBody(size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			cr := newChainRequest(body)
			w := &chainWriter{h: http.Header{}}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				serveChain(b, g, h, cr, w)
			}
		})
	}
}

// BenchmarkEdgeChainParallel is BenchmarkEdgeChain/1KiB from every P at
// once, each goroutine with its own request: the chain's shared state (the
// metrics, the dashboard's recorder, the model catalog, the body pool) is
// written from both cores, as in the proxy at c=16 and 32. Its CPU per
// request over BenchmarkEdgeChain/1KiB's is what the cores' sharing adds.
func BenchmarkEdgeChainParallel(b *testing.B) {
	g := benchGuard(b)
	h := Handler{set: processMetrics()}
	body := benchBody(1 << 10)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		cr := newChainRequest(body)
		w := &chainWriter{h: http.Header{}}
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			return h.ServeHTTP(w, r, chainEngine)
		})
		for pb.Next() {
			cancel := cr.start()
			clear(w.h)
			if err := g.ServeHTTP(w, cr.r, next); err != nil || w.status != http.StatusOK {
				b.Errorf("status %d, error %v", w.status, err)
			}
			cancel()
		}
	})
}

// serveChain runs one request through guard and handler.
func serveChain(tb testing.TB, g *Guard, h Handler, cr *chainRequest, w *chainWriter) {
	cancel := cr.start()
	defer cancel()
	clear(w.h)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return h.ServeHTTP(w, r, chainEngine)
	})
	if err := g.ServeHTTP(w, cr.r, next); err != nil {
		tb.Fatal(err)
	}
	if w.status != http.StatusOK {
		tb.Fatalf("status %d", w.status)
	}
}

// benchHarness is a chain benchmark's "harness": the request made new and
// the engine stand-in alone, what every chain's figure includes besides
// ramjet's own work.
func benchHarness(b *testing.B, cr *chainRequest, w *chainWriter) {
	b.ReportAllocs()
	for b.Loop() {
		cancel := cr.start()
		clear(w.h)
		if err := chainEngine.ServeHTTP(w, cr.r); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}

// chainWriter is a ResponseWriter keeping the status only.
type chainWriter struct {
	h      http.Header
	status int
}

func (w *chainWriter) Header() http.Header         { return w.h }
func (w *chainWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *chainWriter) WriteHeader(s int)           { w.status = s }

// SetReadDeadline takes the guard's body deadline, as Caddy's writer does
// (http.ResponseController).
func (w *chainWriter) SetReadDeadline(time.Time) error { return nil }

// SetWriteDeadline takes ramjet_observe's write deadline.
func (w *chainWriter) SetWriteDeadline(time.Time) error { return nil }

// TestEdgeChainAllocs pins what guard and observe allocate per request
// (BenchmarkEdgeChain's chain, Select aside), over the harness's own
// allocations: the request state's vars entry (stateRef; the state, which
// holds the observe writer, its observers and the guard's writer, is
// pooled and allocates once per concurrent request), the model name, the upstream
// Authorization value's slice and serveChain's next handler. It was 26
// before the observer parts moved into the request state, 13 before the
// usage decode left encoding/json (selection.IntFields), 6 before the
// guard's writer moved into the request state and the bearer value was
// built once (edge.UpstreamAuth).
func TestEdgeChainAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	g := benchGuard(t)
	h := Handler{set: processMetrics()}
	h.WriteTimeout = caddy.Duration(DefaultWriteTimeout)
	cr := newChainRequest(benchBody(1 << 10))
	w := &chainWriter{h: http.Header{}}
	harness := testing.AllocsPerRun(200, func() {
		cancel := cr.start()
		clear(w.h)
		_ = chainEngine.ServeHTTP(w, cr.r)
		cancel()
	})
	chain := testing.AllocsPerRun(200, func() { serveChain(t, g, h, cr, w) })
	const budget = 4
	if got := chain - harness; got > budget {
		t.Errorf("guard + observe allocate %.0f times per request, want at most %d", got, budget)
	}
	t.Logf("guard + observe: %.0f allocations per request (harness %.0f)", chain-harness, harness)
}

// BenchmarkWholeChain is everything ramjet adds to one small request in
// the overhead bench's ramjet site (bench/loadgen/caddyrun,
// GuardedRamjetSite): ramjet_guard, ramjet_observe and the policy's
// Select over 8 replicas, in front of the engine stand-in that reads and
// closes the body as the transport does. Its "harness" is the stand-in
// alone, what round_robin's request costs here besides Caddy's own work.
func BenchmarkWholeChain(b *testing.B) {
	g := benchGuard(b)
	p := newTestPolicy(b, "")
	pool := newTestPool(8)
	h := Handler{set: processMetrics()}
	h.WriteTimeout = caddy.Duration(DefaultWriteTimeout)
	cr := newChainRequest(benchBody(1 << 10))
	w := &chainWriter{h: http.Header{}}
	proxy := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if p.Select(pool, r, w) == nil {
			return errors.New("no upstream")
		}
		return chainEngine.ServeHTTP(w, r)
	})
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		return h.ServeHTTP(w, r, proxy)
	})
	b.Run("harness", func(b *testing.B) { benchHarness(b, cr, w) })
	b.Run("1KiB", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			cancel := cr.start()
			clear(w.h)
			if err := g.ServeHTTP(w, cr.r, next); err != nil || w.status != http.StatusOK {
				b.Fatalf("status %d, error %v", w.status, err)
			}
			cancel()
		}
	})
}

// TestRequestStateSizeClass pins the request state (pooled: allocated once
// per concurrent request) to the 768-byte size class: an object of more than 512
// bytes with pointers carries an 8-byte header in its span, so 760 bytes
// is the most the state may hold (at 896 it took the 1,024-byte class).
func TestRequestStateSizeClass(t *testing.T) {
	if s := unsafe.Sizeof(reqState{}); s > 760 {
		t.Errorf("reqState is %d bytes, want at most 760 (the 768-byte size class with its 8-byte header)", s)
	}
}
