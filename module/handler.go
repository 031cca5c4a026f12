package module

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/edge"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("ramjet_observe", parseHandlerCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("ramjet_observe", httpcaddyfile.Before, "reverse_proxy")
}

// Handler watches the response of a request routed by the ramjet policy.
// Put it in front of reverse_proxy (the ramjet_observe directive is ordered
// there). On the first byte of the response body it marks the request's
// prefill as done, so that its prompt no longer counts as load on the
// replica; when the response ends it releases the request's reservation at
// once instead of when the connection's context ends. It passes flushes
// through, so server-sent events stream unbuffered.
//
// Response observers (usage accounting, metrics) hook into the same
// wrapper; see addObserver.
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

	logger *zap.Logger
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
//		state_key <name>
//	}]
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "state_key":
			if h.StateKey != "" {
				return d.Errf("state_key: option specified more than once")
			}
			v, err := oneArg(d, "state_key")
			if err != nil {
				return err
			}
			h.StateKey = v
		default:
			return d.Errf("unrecognized ramjet_observe option '%s'", d.Val())
		}
	}
	return nil
}

// Provision takes the logger.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	return nil
}

// Validate checks state_key.
func (h *Handler) Validate() error {
	if h.StateKey != "" && !stateKeyRE.MatchString(h.StateKey) {
		return fmt.Errorf("state_key must be 1-64 letters, digits, '_', '.' or '-', got %q", h.StateKey)
	}
	return nil
}

// observedState returns the request's reqState, creating it when the
// handler is the first ramjet module to see the request. A state created
// here needs no context.AfterFunc: ServeHTTP ends it on every path (return
// or abort panic).
func observedState(r *http.Request) *reqState {
	if st := lookupRequest(r); st != nil {
		st.observed = true
		return st
	}
	st := &reqState{slot: -1, stop: noStop, observed: true}
	caddyhttp.SetVar(r.Context(), VarRequest, st)
	return st
}

func noStop() bool { return false }

func parseHandlerCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var m Handler
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return &m, err
}

// ServeHTTP wraps w and calls next.
func (h Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	st := observedState(r)
	if f := lookupFleet(h.StateKey); f != nil {
		if pf := f.kv.Load(); pf != nil {
			logger := h.logger
			if logger == nil {
				logger = zap.NewNop()
			}
			pf.preflight(r, st, f.router().Extractor(), logger)
		}
	}
	rw := &responseWriter{ResponseWriter: w, st: st, r: r}
	for _, f := range observerFactories() {
		if o := f(r, st); o != nil {
			rw.obs = append(rw.obs, o)
		}
	}
	ended := false
	defer func() {
		if !ended {
			// reverse_proxy aborts a response it cannot finish (the client
			// or the upstream went away mid-body) with
			// panic(http.ErrAbortHandler): end the observers and the
			// request all the same; the panic goes on. A stream the
			// client still reads first gets a final SSE error event, so
			// that SDKs report an error rather than a silent end.
			if r.Context().Err() == nil {
				rw.streamError()
			}
			for _, o := range rw.obs {
				o.End(rw.status, http.ErrAbortHandler)
			}
			st.finish()
			st.stop()
		}
	}()
	err := next.ServeHTTP(rw, r)
	ended = true
	for _, o := range rw.obs {
		o.End(rw.status, err)
	}
	st.finish()
	st.stop()
	return err
}

// observer watches one response as it streams to the client. Its methods
// are called on the request's goroutine, in order: WriteHeader for the
// final status (once), Write for each chunk of body (p is only valid
// during the call), End when the handler chain returned (err is its
// error; status 0 when nothing was written).
type observer interface {
	WriteHeader(status int, h http.Header)
	Write(p []byte)
	End(status int, err error)
}

// observerFactory returns the observer for one request, or nil to skip it.
// st is the request's ramjet state: after the upstream's response headers
// arrived it names the chosen replica (st.routeID, st.replica, st.model,
// st.decision).
type observerFactory func(r *http.Request, st *reqState) observer

var observers struct {
	sync.RWMutex
	list []observerFactory
}

// addObserver registers a response observer for every request that passes
// the ramjet handler. Call it from an init function.
func addObserver(f observerFactory) {
	observers.Lock()
	defer observers.Unlock()
	observers.list = append(observers.list, f)
}

func observerFactories() []observerFactory {
	observers.RLock()
	defer observers.RUnlock()
	return observers.list
}

// responseWriter marks prefill done on the first body byte and feeds the
// observers. It deliberately has no ReadFrom, so that every body byte goes
// through Write.
type responseWriter struct {
	http.ResponseWriter
	st      *reqState
	r       *http.Request
	obs     []observer
	status  int
	started bool
	tail    [2]byte // the last two body bytes written
}

func (w *responseWriter) WriteHeader(status int) {
	if w.status == 0 && status >= 200 {
		w.status = status
		if w.st.routeIDHdr != nil {
			// Ours, whatever the upstream sent under the same name.
			w.Header()[HeaderUpstream] = w.st.routeIDHdr
		}
		for _, o := range w.obs {
			o.WriteHeader(status, w.Header())
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.started && len(p) > 0 {
		w.started = true
		w.st.hold.PrefillDone()
	}
	for _, o := range w.obs {
		o.Write(p)
	}
	if n := len(p); n >= 2 {
		w.tail = [2]byte{p[n-2], p[n-1]}
	} else if n == 1 {
		w.tail = [2]byte{w.tail[1], p[0]}
	}
	return w.ResponseWriter.Write(p)
}

// Flush sends buffered data to the client now (SSE).
func (w *responseWriter) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// FlushError is Flush reporting errors (http.ResponseController).
func (w *responseWriter) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack passes connection hijacking (websockets) through.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// streamCutEvent ends an SSE stream the engine cut: an OpenAI-shaped error
// in an "error" event (the OpenAI SDKs turn a data object with an "error"
// field into a stream error).
var streamCutEvent = func() []byte {
	e := edge.NewError(http.StatusBadGateway, edge.TypeServer, edge.CodeUpstreamFailed, "",
		"the engine stopped before the end of the response")
	b, _ := json.Marshal(struct {
		Error *edge.Error `json:"error"`
	}{e})
	return []byte("event: error\ndata: " + string(b) + "\n\n")
}()

// streamError writes streamCutEvent when the response is an SSE stream
// whose body has started (a stream that never started is answered with an
// error status by Caddy instead). Blank lines first end an event the
// engine left half-written.
func (w *responseWriter) streamError() {
	if !w.started || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		return
	}
	if w.tail != [2]byte{'\n', '\n'} {
		if _, err := w.ResponseWriter.Write([]byte("\n\n")); err != nil {
			return
		}
	}
	if _, err := w.ResponseWriter.Write(streamCutEvent); err != nil {
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the wrapped writer (http.ResponseController).
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Interface guards.
var (
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
	_ http.Flusher                = (*responseWriter)(nil)
	_ http.Hijacker               = (*responseWriter)(nil)
)
