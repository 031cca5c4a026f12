package module

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/dashboard"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/usage"
)

// The ramjet_* series. Names are stable; labels are bounded sets:
//
//   - upstream: the replica's opaque route id (X-Ramjet-Upstream), at most
//     selection.MaxReplicas per fleet; "" when no replica was chosen.
//   - fleet: the state_key of the policy (operator-given).
//   - model: a model name the fleet's engines have answered for (at most
//     maxModelLabels of them), else "other".
//   - outcome, reason, rule: the fixed sets below.
//
// Nothing a client controls becomes a label, and no address or prompt text
// ever appears in a series.
const metricsNS = "ramjet"

// Outcomes of a request, the values of the outcome label.
const (
	OutcomeOK            = "ok"             // 1xx-3xx
	OutcomeClientError   = "client_error"   // 4xx, from the engine or from ramjet
	OutcomeUpstreamError = "upstream_error" // 5xx from the engine, or no answer
	OutcomeNoReplica     = "no_replica"     // ramjet found no usable replica (503)
	OutcomeCanceled      = "canceled"       // the client went away first
)

// maxModelLabels bounds the model label: past it, models are "other".
const maxModelLabels = 32

// metricSet holds the collectors ramjet updates on the request path. One
// set is created per process (metrics()) and registered into every config's
// registry, so that values survive config reloads.
type metricSet struct {
	decisions    *prometheus.CounterVec
	tieBreaks    *prometheus.CounterVec
	overlap      prometheus.Histogram
	selectTime   prometheus.Histogram
	requests     *prometheus.CounterVec
	inflight     *prometheus.GaugeVec
	promptTokens *prometheus.CounterVec
	cachedTokens *prometheus.CounterVec
	outputTokens *prometheus.CounterVec
	noUsage      *prometheus.CounterVec
	ttft         *prometheus.HistogramVec
	duration     *prometheus.HistogramVec

	fleet *fleetCollector
	// own is a registry holding only this set.
	own *prometheus.Registry
	// dash counts the same events for the dashboard, typed.
	dash *dashboard.Recorder

	models *catalog.Names
}

func newMetricSet(snap func() []fleetSnapshot) *metricSet {
	m := &metricSet{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNS, Name: "routing_decisions_total",
			Help: "Routing decisions of the ramjet policy, by chosen upstream and reason (affinity, load_override, cold, tie_break, fallback, none).",
		}, []string{"upstream", "reason"}),
		tieBreaks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNS, Name: "tie_breaks_total",
			Help: "Routing decisions settled by a tie-break, by the rule that decided (depth, profile, rendezvous, load, order).",
		}, []string{"rule"}),
		overlap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNS, Name: "prefix_overlap_tokens",
			Help:    "Estimated prompt-prefix overlap with the chosen upstream's cache at decision time, in tokens.",
			Buckets: []float64{0, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768},
		}),
		selectTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNS, Name: "selection_duration_seconds",
			Help:    "Time the ramjet policy spent choosing an upstream (fingerprint, score, pick), in seconds.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 9), // 1µs .. 65ms
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNS, Name: "requests_total",
			Help: "Requests that ended, by upstream, model and outcome (ok, client_error, upstream_error, no_replica, canceled).",
		}, []string{"upstream", "model", "outcome"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNS, Name: "model_inflight_requests",
			Help: "Requests in flight through ramjet, by model.",
		}, []string{"model"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNS, Name: "prompt_tokens_total",
			Help: "Prompt tokens reported in the engines' response usage, by upstream and model.",
		}, []string{"upstream", "model"}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNS, Name: "cached_prompt_tokens_total",
			Help: "Prompt tokens the engines served from their prefix cache (usage cached_tokens), by upstream and model.",
		}, []string{"upstream", "model"}),
		outputTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNS, Name: "completion_tokens_total",
			Help: "Completion (output) tokens reported in the engines' response usage, by upstream and model.",
		}, []string{"upstream", "model"}),
		noUsage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNS, Name: "responses_without_usage_total",
			Help: "Successful responses that carried no usage object (e.g. a stream without stream_options.include_usage), by upstream.",
		}, []string{"upstream"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metricsNS, Name: "time_to_first_token_seconds",
			Help:    "Time from the request reaching ramjet to the first byte of a streamed response, by upstream, in seconds.",
			Buckets: dashboard.TTFTBounds,
		}, []string{"upstream"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metricsNS, Name: "request_duration_seconds",
			Help:    "Time from the request reaching ramjet to the end of its response, by upstream, in seconds.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"upstream"}),
		fleet:  &fleetCollector{snap: snap},
		own:    prometheus.NewPedanticRegistry(),
		dash:   dashboard.NewRecorder(),
		models: modelNames,
	}
	m.own.MustRegister(m.collectors()...)
	return m
}

func (m *metricSet) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.decisions, m.tieBreaks, m.overlap, m.selectTime,
		m.requests, m.inflight, m.promptTokens, m.cachedTokens, m.outputTokens, m.noUsage,
		m.ttft, m.duration, m.fleet}
}

// register adds every collector of m to reg (a config's registry),
// tolerating collectors that are already there (several ramjet modules in
// one config).
func (m *metricSet) register(reg prometheus.Registerer) error {
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return fmt.Errorf("registering ramjet metrics: %w", err)
		}
	}
	return nil
}

// metrics is the process's metric set, created on first use.
var metrics = sync.OnceValue(func() *metricSet { return newMetricSet(snapshotFleets) })

// registerMetrics registers ramjet's collectors into a config's registry;
// every ramjet module calls it from Provision. reg may be nil (a context
// without a registry) and then nothing happens.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	return metrics().register(reg)
}

// modelNames is the process's one registry of model names (the metrics'
// model labels, the dashboard's, the per-request model name): a name joins
// once an engine answered a request for it successfully (so a client's
// made-up names never become series), up to maxModelLabels.
var modelNames = catalog.NewNames(maxModelLabels)

// outcomeOf classifies a finished request.
func outcomeOf(status int, canceled, noReplica bool) string {
	switch {
	case noReplica:
		return OutcomeNoReplica
	case canceled:
		return OutcomeCanceled
	case status >= 500 || status == 0:
		return OutcomeUpstreamError
	case status >= 400:
		return OutcomeClientError
	}
	return OutcomeOK
}

// reasonLabel is the reason label of a decision.
func reasonLabel(d selection.Decision, fallback bool) string {
	switch {
	case fallback:
		return "fallback"
	case d.Index < 0:
		return "none"
	}
	return d.Reason.String()
}

// observeSelection records one routing decision of the policy and the time
// it took.
func (m *metricSet) observeSelection(upstream string, d selection.Decision, fallback bool, took time.Duration) {
	reason := reasonLabel(d, fallback)
	m.decisions.WithLabelValues(upstream, reason).Inc()
	m.dash.Decision(upstream, reason)
	if fallback || d.Index < 0 {
		return
	}
	m.selectTime.Observe(took.Seconds())
	m.overlap.Observe(float64(d.Overlap))
	if d.Tie > selection.TieNone {
		m.tieBreaks.WithLabelValues(d.Tie.String()).Inc()
	}
}

// exchange is what the metrics learn about one finished request.
type exchange struct {
	Fleet    string
	Upstream string // opaque route id, "" when none was chosen
	Model    string // the request's model name, "" when unknown
	Status   int
	Canceled bool
	// NoReplica: ramjet answered 503 because no replica was usable.
	NoReplica bool
	Stream    bool
	Start     time.Time
	FirstByte time.Time // zero when no body byte was written
	End       time.Time
	Usage     usage.Usage
	HasUsage  bool

	Decision selection.Decision
	Fallback bool
	Selected bool // a policy decision was made for the request
}

// startRequest counts a request in flight for model and returns the label
// to pass to endRequest.
func (m *metricSet) startRequest(model string) string {
	l := m.models.Label(model)
	m.inflight.WithLabelValues(l).Inc()
	m.dash.Begin(l)
	return l
}

// endRequest records a finished request; inflightLabel is what
// startRequest returned.
func (m *metricSet) endRequest(inflightLabel string, x *exchange) {
	m.inflight.WithLabelValues(inflightLabel).Dec()
	outcome := outcomeOf(x.Status, x.Canceled, x.NoReplica)
	var model string
	if outcome == OutcomeOK {
		model = m.models.Add(x.Model)
	} else {
		model = m.models.Label(x.Model)
	}
	dx := dashboard.Exchange{Upstream: x.Upstream, Model: model, Error: outcome != OutcomeOK, HasUsage: x.HasUsage,
		Prompt: x.Usage.PromptTokens, Cached: x.Usage.CachedTokens, Output: x.Usage.CompletionTokens}
	if x.Stream && !x.FirstByte.IsZero() {
		dx.TTFT = max(x.FirstByte.Sub(x.Start), time.Nanosecond)
	}
	defer m.dash.End(inflightLabel, dx)
	// The request counts last, so that a scrape that sees it sees its
	// tokens too.
	defer m.requests.WithLabelValues(x.Upstream, model, outcome).Inc()
	if x.Upstream == "" {
		return
	}
	if x.HasUsage {
		m.promptTokens.WithLabelValues(x.Upstream, model).Add(float64(x.Usage.PromptTokens))
		m.cachedTokens.WithLabelValues(x.Upstream, model).Add(float64(x.Usage.CachedTokens))
		m.outputTokens.WithLabelValues(x.Upstream, model).Add(float64(x.Usage.CompletionTokens))
	} else if outcome == OutcomeOK {
		m.noUsage.WithLabelValues(x.Upstream).Inc()
	}
	if x.Stream && !x.FirstByte.IsZero() {
		m.ttft.WithLabelValues(x.Upstream).Observe(x.FirstByte.Sub(x.Start).Seconds())
	}
	if !x.End.IsZero() {
		m.duration.WithLabelValues(x.Upstream).Observe(x.End.Sub(x.Start).Seconds())
	}
}

// fleetSnapshot is the state of one fleet at scrape time.
type fleetSnapshot struct {
	Key            string
	Config         selection.Config
	Replicas       []replicaSnapshot
	IndexEntries   int64
	IndexBytes     int64
	IndexBudget    int64
	IndexEvictions uint64
}

// replicaSnapshot is one replica at scrape time. It carries the opaque id
// only: never the address.
type replicaSnapshot struct {
	ID             string  `json:"id"`
	Slot           int     `json:"slot"`
	Rank           int     `json:"rank"`
	Inflight       int64   `json:"inflight"`
	PendingPrefill int64   `json:"pending_prefill_tokens"`
	Load           float64 `json:"load_tokens"`
	Known          bool    `json:"known"`
	Healthy        bool    `json:"healthy"`
	Available      bool    `json:"available"`
	Quarantined    bool    `json:"quarantined"`
	Fails          int     `json:"fails"`
	Profile        string  `json:"profile"`
	// Ejected: outlier detection holds the replica out; Ejections counts
	// its ejections by selection.FailureKinds.
	Ejected   bool                                `json:"ejected"`
	Ejections [len(selection.FailureKinds)]uint64 `json:"-"`
	// Integrity is the engine-integrity state, when configured
	// (integrity.go); an upstream it holds out is not Available.
	Integrity *integrityReport `json:"integrity,omitempty"`
}

// fleetCollector reads every live fleet's Router at scrape time (as
// prometheus' example_clustermanager_test.go): the core knows nothing of
// Prometheus.
type fleetCollector struct {
	snap func() []fleetSnapshot
}

var (
	fleetLabels   = []string{"fleet"}
	replicaLabels = []string{"fleet", "upstream"}

	descInflight = prometheus.NewDesc("ramjet_upstream_inflight_requests",
		"Requests ramjet has reserved on the upstream and not yet released.", replicaLabels, nil)
	descPending = prometheus.NewDesc("ramjet_upstream_pending_prefill_tokens",
		"Estimated prompt tokens the upstream has yet to prefill for ramjet's in-flight requests.", replicaLabels, nil)
	descLoad = prometheus.NewDesc("ramjet_upstream_load_tokens",
		"Live load of the upstream as the routing rule sees it: request_cost per in-flight request plus pending prefill, in tokens.", replicaLabels, nil)
	descHealthy = prometheus.NewDesc("ramjet_upstream_healthy",
		"1 when the upstream passes Caddy's health checks, else 0.", replicaLabels, nil)
	descAvailable = prometheus.NewDesc("ramjet_upstream_available",
		"1 when the upstream can take requests (healthy, not quarantined, under its request limit), else 0.", replicaLabels, nil)
	descQuarantined = prometheus.NewDesc("ramjet_upstream_quarantined",
		"1 when the upstream is healthy but taken out of rotation by passive health checks (too many recent failures), else 0.", replicaLabels, nil)
	descEntries = prometheus.NewDesc("ramjet_index_entries",
		"Prefix blocks held by the approximate index.", fleetLabels, nil)
	descBytes = prometheus.NewDesc("ramjet_index_bytes",
		"Memory held by the approximate index, in bytes.", fleetLabels, nil)
	descBudget = prometheus.NewDesc("ramjet_index_budget_bytes",
		"Memory budget of the approximate index, in bytes.", fleetLabels, nil)
	descEvictions = prometheus.NewDesc("ramjet_index_evictions_total",
		"Prefix blocks evicted from the approximate index to stay within its budget.", fleetLabels, nil)
	descEjected = prometheus.NewDesc("ramjet_upstream_ejected",
		"1 when outlier detection holds the upstream out (its recent answers failed: 5xx, connection failures, cut streams, timeouts), else 0.", replicaLabels, nil)
	descEjections = prometheus.NewDesc("ramjet_ejections_total",
		"Ejections of the upstream by outlier detection, by the kind of the failure that ejected it (status, connect, cut, timeout).", append(replicaLabels, "reason"), nil)
	descReplicas = prometheus.NewDesc("ramjet_upstreams",
		"Replicas known to the fleet (every data-parallel rank counts).", fleetLabels, nil)
)

// Describe sends the fixed descriptors: the set of series varies with the
// fleet, the descriptors never do.
func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInflight, descPending, descLoad, descHealthy,
		descAvailable, descQuarantined, descEjected, descEjections, descEntries, descBytes, descBudget, descEvictions, descReplicas} {
		ch <- d
	}
}

// Collect reads the fleets.
func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.snap() {
		ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(f.IndexEntries), f.Key)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(f.IndexBytes), f.Key)
		ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(f.IndexBudget), f.Key)
		ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(f.IndexEvictions), f.Key)
		ch <- prometheus.MustNewConstMetric(descReplicas, prometheus.GaugeValue, float64(len(f.Replicas)), f.Key)
		seen := make(map[string]bool, len(f.Replicas))
		for _, r := range f.Replicas {
			if r.ID == "" || seen[r.ID] {
				continue
			}
			seen[r.ID] = true
			ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(r.Inflight), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(r.PendingPrefill), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descLoad, prometheus.GaugeValue, r.Load, f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, b2f(r.Healthy), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descAvailable, prometheus.GaugeValue, b2f(r.Available), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descQuarantined, prometheus.GaugeValue, b2f(r.Quarantined), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descEjected, prometheus.GaugeValue, b2f(r.Ejected), f.Key, r.ID)
			for i, k := range selection.FailureKinds {
				ch <- prometheus.MustNewConstMetric(descEjections, prometheus.CounterValue, float64(r.Ejections[i]), f.Key, r.ID, k.String())
			}
		}
	}
}

var _ prometheus.Collector = (*fleetCollector)(nil)

// snapshotFleets reads every live fleet (lookupFleet, fleetKeys).
func snapshotFleets() []fleetSnapshot {
	keys := fleetKeys()
	out := make([]fleetSnapshot, 0, len(keys))
	for _, k := range keys {
		if f := lookupFleet(k); f != nil {
			out = append(out, snapshotFleet(f))
		}
	}
	return out
}

// snapshotFleet reads one fleet: its Router's index and load, and the
// health Caddy's upstream pools report.
func snapshotFleet(f *fleet) fleetSnapshot {
	rt := f.router()
	idx := rt.Index()
	cfg := rt.Config()
	fs := fleetSnapshot{Key: f.stateKey, Config: cfg, IndexEntries: idx.Entries(),
		IndexBytes: idx.Bytes(), IndexBudget: idx.Budget(), IndexEvictions: idx.Evictions()}
	od := f.detector()
	for _, r := range f.replicas() {
		ir := integrityStatus(f, r.Key)
		var ej [len(selection.FailureKinds)]uint64
		for i, k := range selection.FailureKinds {
			ej[i] = od.Ejections(r.Slot, k)
		}
		fs.Replicas = append(fs.Replicas, replicaSnapshot{
			Ejected: od.Ejected(r.Slot), Ejections: ej,
			ID: r.ID, Slot: int(r.Slot), Rank: r.Rank,
			Inflight: r.Inflight, PendingPrefill: r.PendingPrefill,
			Load:        float64(r.Inflight*int64(cfg.RequestCost) + r.PendingPrefill),
			Known:       r.Known,
			Healthy:     r.Known && r.Healthy,
			Available:   r.Known && r.Available && (ir == nil || !ir.Out),
			Integrity:   ir,
			Quarantined: r.Known && !r.Healthy && r.Fails > 0,
			Fails:       r.Fails,
			Profile:     profileName(r.Profile),
		})
	}
	return fs
}

func profileName(p selection.Profile) string {
	if p == selection.ProfileSpeculative {
		return "speculative"
	}
	return "standard"
}

func init() { addObserver(newMetricsObserver) }

// metricsObserver accounts one request for the metrics and the dashboard:
// status, time to first byte, and the usage the engine reports in the
// response body, read by a usage.Scanner as the body streams past.
type metricsObserver struct {
	m        *metricSet
	st       *reqState
	r        *http.Request
	start    time.Time
	first    time.Time
	status   int
	stream   bool
	scan     bool
	selected bool
	modelLbl string
	usage    usage.Scanner
	// tail holds the last bytes of the body, to see the SSE end marker.
	tail    [16]byte
	tailLen int
}

// sseDone is the marker of a complete chat/completions stream.
var sseDone = []byte("data: [DONE]")

var observerPool = sync.Pool{New: func() any { return new(metricsObserver) }}

func newMetricsObserver(r *http.Request, st *reqState) observer {
	o := observerPool.Get().(*metricsObserver)
	o.m, o.st, o.r, o.start = metrics(), st, r, time.Now()
	st.metrics = o // found by observeSelect
	return o
}

// observeSelect is called by the policy's Select (deferred, with the time
// Select started) once st holds the attempt's decision.
func observeSelect(r *http.Request, st *reqState, t0 time.Time) {
	took := time.Since(t0)
	m := metrics()
	m.observeSelection(st.routeID, st.decision, st.fallback, took)
	if o := st.metrics; o != nil && !o.selected && o.st == st {
		o.selected = true
		o.modelLbl = m.startRequest(st.model)
	}
}

func (o *metricsObserver) WriteHeader(status int, h http.Header) {
	o.status = status
	o.stream = strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
	// Only an uncompressed successful body carries readable usage.
	o.scan = status < 300 && h.Get("Content-Encoding") == ""
}

func (o *metricsObserver) Write(p []byte) {
	if o.first.IsZero() && len(p) > 0 {
		o.first = time.Now()
	}
	if o.scan {
		o.usage.Write(p)
	}
	if len(p) >= len(o.tail) {
		o.tailLen = copy(o.tail[:], p[len(p)-len(o.tail):])
	} else {
		keep := min(o.tailLen, len(o.tail)-len(p))
		copy(o.tail[:], o.tail[o.tailLen-keep:o.tailLen])
		o.tailLen = keep + copy(o.tail[keep:], p)
	}
}

// complete reports that the body reached its end marker: the SSE [DONE],
// or a usage object (the last chunk of a stream with include_usage, the
// response.completed event, the end of a JSON body).
func (o *metricsObserver) complete(hasUsage bool) bool {
	return hasUsage || bytes.Contains(o.tail[:o.tailLen], sseDone)
}

func (o *metricsObserver) End(status int, err error) {
	now := time.Now()
	st := o.st
	x := exchange{
		Upstream: st.routeID, Model: st.model, Stream: o.stream,
		Start: o.start, FirstByte: o.first, End: now,
		Decision: st.decision, Fallback: st.fallback, Selected: o.selected,
	}
	if st.fleet != nil {
		x.Fleet = st.fleet.stateKey
	}
	x.Status = status
	if x.Status == 0 {
		x.Status = errStatus(err)
	}
	x.NoReplica = o.selected && !st.fallback && st.decision.Index < 0
	if o.scan {
		x.Usage, x.HasUsage = o.usage.Result()
	}
	// Canceled: the client went away before the response ended. Caddy
	// records 499 when that happens before the headers, and aborts the
	// handler (http.ErrAbortHandler) after them; a client that closes
	// right after the end marker got a complete response.
	gone := o.r.Context().Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, http.ErrAbortHandler)
	switch {
	case x.Status == statusClientClosed:
		x.Canceled = true
	case err != nil && gone:
		x.Canceled = !(x.Status < 300 && o.complete(x.HasUsage))
	}
	switch {
	case o.selected:
		o.m.endRequest(o.modelLbl, &x)
		recentDecisions.Add(recordOf(&x))
	case o.r.Method == http.MethodPost && selection.EndpointForPath(o.r.URL.Path) != selection.EndpointUnknown:
		// An LLM request answered before any routing (malformed, unknown
		// model, too large): it counts, with no upstream.
		o.m.endRequest(o.m.startRequest(x.Model), &x)
	}
	if st.metrics == o {
		st.metrics = nil
	}
	o.usage.Reset()
	*o = metricsObserver{usage: o.usage}
	observerPool.Put(o)
}

// statusClientClosed is the status Caddy records when the client went
// away before the response headers (nginx's 499).
const statusClientClosed = 499

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

// recordOf is the dashboard's view of an exchange.
func recordOf(x *exchange) dashboard.Record {
	d := x.Decision
	rec := dashboard.Record{
		Time: x.Start.UnixMilli(), Fleet: x.Fleet, Upstream: x.Upstream,
		Model:  metrics().models.Label(x.Model),
		Reason: reasonLabel(d, x.Fallback), Overlap: d.Overlap, BestOverlap: d.BestOverlap,
		Load: d.Load, Usable: d.Usable, Outcome: outcomeOf(x.Status, x.Canceled, x.NoReplica),
		Status:      x.Status,
		TotalMillis: float64(x.End.Sub(x.Start).Microseconds()) / 1000,
	}
	if !x.Fallback && d.Index >= 0 {
		rec.Score = d.Score
		if d.Tie > selection.TieNone {
			rec.Tie = d.Tie.String()
		}
	}
	if x.Stream && !x.FirstByte.IsZero() {
		rec.TTFTMillis = float64(x.FirstByte.Sub(x.Start).Microseconds()) / 1000
	}
	if x.HasUsage {
		rec.PromptTokens, rec.CachedTokens = x.Usage.PromptTokens, x.Usage.CachedTokens
	}
	return rec
}
