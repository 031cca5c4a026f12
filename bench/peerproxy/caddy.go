package peerproxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

func init() {
	caddy.RegisterModule(Handler{})
	caddy.RegisterModule(Selection{})
}

// MaxBodyBytes bounds the request body the handler reads (larger bodies
// are not routed by the policy).
const MaxBodyBytes = 64 << 20

// varRequest is the Caddy vars key of the request's *request.
const varRequest = "bench_peer.request"

// adapters are the Registered adapters, by name.
var adapters sync.Map

// Register makes a available to the modules configured with name; the
// returned func removes it. Register before loading the Caddy config.
func Register(name string, a *Adapter) (unregister func()) {
	adapters.Store(name, a)
	return func() { adapters.CompareAndDelete(name, a) }
}

func lookup(name string) (*Adapter, error) {
	v, ok := adapters.Load(name)
	if !ok {
		return nil, fmt.Errorf("bench_peer: no adapter registered as %q", name)
	}
	return v.(*Adapter), nil
}

// Handler (http.handlers.bench_peer) reads a generation request's body,
// tokenizes it as the engine simulator does and keeps it for the
// bench_peer selection policy; it reports the response's first byte and
// its end to the Adapter. Place it before reverse_proxy.
type Handler struct {
	// Name is the Adapter's Register name.
	Name string `json:"name"`

	a *Adapter
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.bench_peer", New: func() caddy.Module { return new(Handler) }}
}

// Provision finds the Adapter.
func (h *Handler) Provision(caddy.Context) (err error) {
	h.a, err = lookup(h.Name)
	return err
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	chat := r.URL.Path == "/v1/chat/completions"
	if r.Method != http.MethodPost || !chat && r.URL.Path != "/v1/completions" {
		return next.ServeHTTP(w, r)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading body: %w", err))
	}
	if len(body) > MaxBodyBytes {
		// Too large to route: forwarded whole (what was read, then the
		// rest), and the policy falls back.
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		h.a.fallback()
		return next.ServeHTTP(w, r)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	prompt, err := enginesim.PromptTokens(body, chat)
	if err != nil {
		h.a.fallback()
		return next.ServeHTTP(w, r) // the engine answers 400; the policy falls back
	}
	st := h.a.newRequest(prompt)
	caddyhttp.SetVar(r.Context(), varRequest, st)
	// Deferred: reverse_proxy ends a response it could not finish (the
	// client went away mid-stream, or right after the last event while
	// the proxy still waited for the upstream's end) by panicking with
	// http.ErrAbortHandler, and the request must end in the policy then
	// too, as a gateway's in-flight count (SGLang's load guard) drops
	// whatever way the response ended. Called after the return only, the
	// abort path left the request in flight for good: its replica's
	// InFlight (SGLang's load) and the policy's own state (Dynamo's active
	// blocks) grew for the rest of the run.
	defer h.a.done(st)
	fw := &firstWriter{ResponseWriter: w, first: func() { h.a.firstToken(st) }}
	return next.ServeHTTP(fw, r)
}

// firstWriter calls first at the response's first body byte (the first
// token of a stream: the engine simulator flushes the headers before it).
type firstWriter struct {
	http.ResponseWriter
	first func()
	seen  bool
}

func (w *firstWriter) Write(b []byte) (int, error) {
	if !w.seen && len(b) > 0 {
		w.seen = true
		w.first()
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (Flush).
func (w *firstWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush flushes the underlying writer.
func (w *firstWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// Selection (http.reverse_proxy.selection_policies.bench_peer) routes each
// request the bench_peer handler tokenized with the Adapter's policy;
// other requests go to the first available upstream.
type Selection struct {
	// Name is the Adapter's Register name.
	Name string `json:"name"`

	a *Adapter
}

// CaddyModule returns the Caddy module information.
func (Selection) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.reverse_proxy.selection_policies.bench_peer", New: func() caddy.Module { return new(Selection) }}
}

// Provision finds the Adapter.
func (s *Selection) Provision(caddy.Context) (err error) {
	s.a, err = lookup(s.Name)
	return err
}

// Select implements reverseproxy.Selector.
func (s *Selection) Select(pool reverseproxy.UpstreamPool, r *http.Request, _ http.ResponseWriter) *reverseproxy.Upstream {
	if st, _ := caddyhttp.GetVar(r.Context(), varRequest).(*request); st != nil {
		if rep := s.a.pick(st); rep >= 0 {
			for _, u := range pool {
				if u.Dial == s.a.cfg.Upstreams[rep] && u.Available() {
					return u
				}
			}
			s.a.done(st) // not in the pool or down: not routed there
		}
		s.a.fallback()
	}
	for _, u := range pool {
		if u.Available() {
			return u
		}
	}
	return nil
}

var (
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ reverseproxy.Selector       = (*Selection)(nil)
	_ caddy.Provisioner           = (*Selection)(nil)
)
