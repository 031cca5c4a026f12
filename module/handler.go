package module

import (
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/caddyblock"
	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/observe"
)

func init() {
	caddy.RegisterModule(Handler{})
	registerHandler[Handler]("ramjet_observe", httpcaddyfile.Before, "reverse_proxy")
}

// Handler watches the response of a request routed by the ramjet policy.
// Put it in front of reverse_proxy (the ramjet_observe directive is ordered
// there). On the first byte of the response body it marks the request's
// prefill as done, so that its prompt no longer counts as load on the
// replica; when the response ends it releases the request's reservation at
// once instead of when the connection's context ends. It passes flushes
// through, so server-sent events stream unbuffered.
//
// The response goes through an observe.Writer feeding its
// responseObserver (metrics.go): the request's state, the metrics and the
// outlier detector's outcome (outlier.go).
//
// When the policy of the same state_key has the precise path on (kv), the
// handler also runs its /tokenize preflight here, before reverse_proxy
// selects: bounded by tokenize_timeout and tokenize_concurrency, so that no
// network I/O happens inside the selection policy and lb_try_duration
// counts only the proxying. The token ids are kept in the request's state
// for Select.
type Handler struct {
	// StateKey names the ramjet policy state whose precise path this
	// handler serves (the policy's state_key). Default: "default".
	StateKey string `json:"state_key,omitempty"`

	// WriteTimeout bounds every write of a response to the client: a
	// client that stops reading (an SSE stream it no longer consumes) is
	// cut after this long without progress, instead of holding the
	// proxy's goroutine and an engine slot for as long as it keeps the
	// connection open. It bounds no progress, not the stream's length.
	// Default 60s; -1 (Caddyfile: off) turns it off.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`

	logger *zap.Logger
	set    *metrics.Set // the process's metric set (processMetrics), held from Provision
	// extra adds an observer to each request's (tests).
	extra observerFactory
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.ramjet_observe",
		New: func() caddy.Module { return new(Handler) },
	}
}

// UnmarshalCaddyfile sets up the handler. Syntax:
//
//	ramjet_observe [{
//		state_key     <name>
//		write_timeout <duration>|off
//	}]
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return optionBlock(d, "ramjet_observe", h, map[string]map[string]any{"write_timeout": {"off": -1}})
}

// registerHandler registers the Caddyfile directive name of the handler
// module T (each file's init registers its own), parsed by
// T.UnmarshalCaddyfile and ordered pos (httpcaddyfile.Before or After)
// the directive other.
func registerHandler[T any, PT interface {
	*T
	caddyhttp.MiddlewareHandler
	caddyfile.Unmarshaler
}](name string, pos httpcaddyfile.Positional, other string) {
	httpcaddyfile.RegisterHandlerDirective(name, func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := PT(new(T))
		return m, m.UnmarshalCaddyfile(h.Dispenser)
	})
	httpcaddyfile.RegisterDirectiveOrder(name, pos, other)
}

// optionBlock parses a directive that takes no arguments and a block of
// v's options (package caddyblock), each given at most once with one
// value; words are the keywords of options besides their values.
func optionBlock(d *caddyfile.Dispenser, directive string, v any, words map[string]map[string]any) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	b := &caddyblock.Block{Name: directive, Words: words}
	return b.Parse(d, v)
}

// Provision takes the logger and the metric set, fills the default
// write_timeout and registers the slow reader counter.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger, h.set = ctx.Logger(), processMetrics()
	if h.WriteTimeout == 0 {
		h.WriteTimeout = caddy.Duration(DefaultWriteTimeout)
	}
	return register(ctx.GetMetricsRegistry(), slowReaderCuts)
}

// Validate checks state_key and write_timeout.
func (h *Handler) Validate() error {
	if h.WriteTimeout < -1 {
		return fmt.Errorf("write_timeout must be positive or -1 (off), got %v", time.Duration(h.WriteTimeout))
	}
	return fleetstate.CheckStateKey(h.StateKey)
}

// ServeHTTP wraps w and calls next.
func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// A state created here needs no sweeper: ServeHTTP ends it on every
	// path (return or abort panic), and recycles it (recycle).
	st, created := ownedState(w, r)
	st.observed = true
	// No fleet lookup while no policy has the precise path on (kvLive is
	// empty; a policy stores its preflight before it joins kvLive: kv.go).
	if !kvLive.Empty() {
		if f := lookupFleet(h.StateKey); f != nil {
			if pf := f.kv.Load(); pf != nil {
				logger := h.logger
				if logger == nil {
					logger = zap.NewNop()
				}
				pf.preflight(r, st, f.Router().Extractor(), logger)
			}
		}
	}
	p, own := &st.obsv, !st.obsvInUse
	if !own {
		p = new(observedParts)
	}
	st.obsvInUse = true
	obs := append(p.list[:0], newResponseObserver(r, st, h.set))
	if st.route.kv != nil { // kvrequest.go: the request's predictions end with it
		obs = append(obs, st.route.kv)
	}
	if h.extra != nil {
		if o := h.extra(r, st); o != nil {
			obs = append(obs, o)
		}
	}
	// Behind the guard its writer feeds the observers (one writer).
	ow, _ := w.(*observe.Writer)
	if ow == nil || !ow.Adopt(obs) {
		if ow = &p.w; own && st.guardW { // a guard in front writes through p.w
			ow = new(observe.Writer)
		}
		ow.Init(w, obs)
		ow.SetOwner(st) // a guard and the policy behind find st there
	}
	if h.WriteTimeout > 0 {
		b := ow.Bound() // a guard in front looked Caddy's idle timeouts up (guard.go)
		if b == nil {
			_, iw := caddyhttp.IdleTimeoutsFromContext(r.Context())
			b = (*idleWriter)(iw)
		}
		ow.SetWriteTimeout(time.Duration(h.WriteTimeout), countSlowReader, b)
	}
	err := ow.Serve(r, next, edge.StreamCutEvent, st)
	if created {
		st.recycle(err == nil)
	}
	return err
}

// ResponseDone ends the request once the handler's response ended
// (observe.Doner): its reservation is released now rather than when its
// context ends.
func (st *reqState) ResponseDone() { st.finish() }

// observerFactory returns an observer of one request's response, or nil
// to skip it. st is the request's ramjet state: after the upstream's
// response headers arrived it names the chosen replica (st.routeID(),
// st.slot, st.model, st.decision).
type observerFactory func(r *http.Request, st *reqState) observe.Observer

// Interface guards.
var (
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)

// DefaultWriteTimeout bounds one write of a response to the client without
// progress (ramjet_observe's write_timeout): a client that stopped reading
// a stream is cut after it.
const DefaultWriteTimeout = 60 * time.Second

// slowReaderCuts counts the responses cut because the client stopped
// reading (write_timeout); process-wide, registered into every config's
// registry.
var slowReaderCuts = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "ramjet_slow_reader_cuts_total",
	Help: "Responses cut because the client made no progress reading them for write_timeout.",
})

func countSlowReader() { slowReaderCuts.Inc() }

// idleWriter is Caddy's write idle timeout of a request (observe.Bound;
// nil: none), pushed to now+Timeout before every write and flush.
type idleWriter caddyhttp.IdleTimeoutWriter

func (w *idleWriter) Bounds(d time.Duration) bool { return w != nil && idleBounds(&w.Deadline, d) }

// idleBounds: Caddy's idle timeout dl bounds every read or write by at
// most d (a minimum rate's deadline grows with the bytes moved).
func idleBounds(dl *caddyhttp.IdleDeadline, d time.Duration) bool {
	return dl.MinRate == 0 && dl.Timeout > 0 && dl.Timeout <= d
}
