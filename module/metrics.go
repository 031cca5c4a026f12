package module

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/observe"
	"github.com/ramjet-llm/ramjet/selection"
)

// The ramjet_* series are package metrics' (names, labels, collectors);
// this file feeds them from the request path.

// maxModelLabels bounds the model label: past it, models are "other".
const maxModelLabels = 32

// modelNames is the process's one registry of model names (the metrics'
// model labels, the dashboard's, the per-request model name): a name joins
// once an engine answered a request for it successfully (so a client's
// made-up names never become series), up to maxModelLabels.
var modelNames = catalog.NewNames(maxModelLabels)

// processMetrics is the process's metric set, created on first use and
// registered into every config's registry, so that values survive config
// reloads.
var processMetrics = sync.OnceValue(func() *metrics.Set { return metrics.NewSet(snapshotFleets, modelNames) })

// registerMetrics registers ramjet's process-wide collectors into a
// config's registry (the admin API and the dashboard call it from Provision).
func registerMetrics(reg *prometheus.Registry) error {
	return register(reg, processMetrics().Collectors()...)
}

// register registers collectors into a config's registry, created once per
// process so that values survive reloads. reg may be nil (a context without
// a registry) and then nothing happens.
func register(reg *prometheus.Registry, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	return metrics.Register(reg, cs...)
}

// responseObserver is the ramjet handler's one observer of a response
// (handler.go), doing in order what three did: the request state's part
// (X-Ramjet-Upstream on the header, the prefill done on the first body
// byte), the metrics' and the dashboard's (its metrics.Response: status,
// time to first byte, usage, end marker) and last the outlier detector's
// (endOutcome, outlier.go). It stays with its request state from one
// request to the next (st.metrics, kept by recycle), idle while st is nil.
type responseObserver struct {
	metrics.Response
	m        *metrics.Set
	st       *reqState
	r        *http.Request
	start    time.Time
	selected bool
	started  bool // body bytes were written
	inflight metrics.Inflight
}

func newResponseObserver(r *http.Request, st *reqState, m *metrics.Set) observe.Observer {
	o := st.metrics // the state's own, unless in use (a second handler on the request)
	if o == nil || o.st != nil {
		o = new(responseObserver)
	}
	o.m, o.st, o.r, o.start = m, st, r, time.Now()
	o.Response.Start = o.start // its first byte's time is read from the monotonic clock
	st.metrics = o             // found by observeSelect
	return o
}

// observeSelect is called by the policy's Select (deferred, with its
// metric set and metrics.MonoNow when Select started) once st holds the
// attempt's decision.
func observeSelect(m *metrics.Set, st *reqState, t0 time.Duration) {
	took, id := metrics.MonoNow()-t0, st.routeID()
	m.ObserveSelection(id, st.decision, st.fallback, took)
	if o := st.metrics; o != nil && !o.selected && o.st == st {
		o.selected = true
		o.inflight = m.StartRequest(id, st.model)
	}
}

func (o *responseObserver) WriteHeader(status int, h http.Header) {
	if o.st.routeIDHdr != nil { // ours, whatever the upstream sent under the same name
		h[HeaderUpstream] = o.st.routeIDHdr
	}
	o.Response.WriteHeader(status, h)
}

func (o *responseObserver) Write(p []byte) {
	if !o.started && len(p) > 0 {
		o.started = true
		o.st.foreignEvent(false) // foreign.go; before PrefillDone, or a run stored between them is foreign
		o.st.hold.PrefillDone()
	}
	o.Response.Write(p)
}

func (o *responseObserver) End(status int, err error) {
	st, wrote := o.st, status
	if o.started {
		st.foreignEvent(true) // foreign.go: the request's life
	}
	x := metrics.Exchange{
		// End only ever meets Start in a difference: Start plus the
		// monotonic time since (one clock read, not time.Now's two).
		Upstream: st.routeID(), Model: st.model, Start: o.start, End: o.start.Add(time.Since(o.start)),
		Decision: st.decision, Fallback: st.fallback, Selected: o.selected,
	}
	if st.fleet != nil {
		x.Fleet = st.fleet.StateKey
	}
	if status == 0 {
		status = errStatus(err)
	}
	x.NoReplica = o.selected && !st.fallback && st.decision.Index < 0
	o.Fill(&x, status, err, err != nil && o.r.Context().Err() != nil) // Fill reads clientGone only with an error
	if x.HasUsage && st.learned != nil && st.fleet != nil {
		// Learn from the answer: the engine's own count of cached prompt
		// tokens corrects the index for what it evicted (selection.Observe).
		// An unreported count is unknown, not "none cached" (usage.Usage.Cached).
		st.fleet.Router().Observe(st.learned, int(x.Usage.PromptTokens), x.Usage.Cached(), int(x.Usage.CompletionTokens))
	}
	o.m.Finish(&x, o.inflight, !o.selected && o.r.Method == http.MethodPost && selection.EndpointForPath(o.r.URL.Path) != selection.EndpointUnknown)
	endOutcome(o.r, st, wrote, err)
	o.Reset()
	o.m, o.st, o.r, o.start, o.selected, o.started, o.inflight = nil, nil, nil, time.Time{}, false, false, metrics.Inflight{} // Reset cleared the Response in place
}

// errStatus is the status a handler error will be answered with.
func errStatus(err error) int {
	if err == nil {
		return http.StatusOK
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}
