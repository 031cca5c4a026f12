package metrics

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/dashboard"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/usage"
)

// The ramjet_* series. Names are stable; labels are bounded sets:
//
//   - upstream: the replica's opaque route id (X-Ramjet-Upstream), at most
//     selection.MaxReplicas per fleet; "" when no replica was chosen.
//   - fleet: the state_key of the policy (operator-given).
//   - model: a model name the fleet's engines have answered for (at most
//     the catalog.Names bound), else "other".
//   - outcome, reason, rule: the fixed sets below.
//
// Nothing a client controls becomes a label, and no address or prompt text
// ever appears in a series.
const namespace = "ramjet"

// Outcomes of a request, the values of the outcome label.
const (
	OutcomeOK            = "ok"             // 1xx-3xx
	OutcomeClientError   = "client_error"   // 4xx, from the engine or from ramjet
	OutcomeUpstreamError = "upstream_error" // 5xx from the engine, or no answer
	OutcomeNoReplica     = "no_replica"     // ramjet found no usable replica (503)
	OutcomeCanceled      = "canceled"       // the client went away first
)

// outcomes are the outcome label's values, in the order of outcomeOf's
// index.
var outcomes = [...]string{OutcomeOK, OutcomeClientError, OutcomeUpstreamError, OutcomeNoReplica, OutcomeCanceled}

// Set holds the collectors ramjet updates on the request path. One set is
// created per process and registered into every config's registry, so that
// values survive config reloads. The collectors are exported for tests;
// update them through the methods.
type Set struct {
	// Requests exposes the counts of the request path kept in records
	// (decisions, requests in flight, and what finished requests update:
	// requests, tokens, responses without usage, TTFT, duration), which
	// the dashboard samples too (DashboardSample), and the decisions'
	// selection time and overlap histograms and tie-breaks.
	Requests prometheus.Collector

	// Fleet reads the fleets' snapshots at scrape time.
	Fleet prometheus.Collector
	// Own is a registry holding only this set.
	Own *prometheus.Registry
	// recent keeps the last routed requests (Finish, RecentRecords).
	recent recent

	// Models names the model labels (a name joins once an engine answered
	// a request for it successfully).
	Models *catalog.Names
	snap   func() []fleetstate.Snapshot

	// recs are the series of finished requests, by (upstream, model label).
	recs records
	// decided is the decisions' histograms (selection time, overlap).
	decided decided
}

// NewSet returns a metric set whose fleet series read snap at scrape time
// and whose model labels are the names of models.
func NewSet(snap func() []fleetstate.Snapshot, models *catalog.Names) *Set {
	m := &Set{
		Fleet:  NewFleetCollector(snap),
		Own:    prometheus.NewPedanticRegistry(),
		Models: models,
		snap:   snap,
	}
	m.Requests = newRequestSeries(&m.recs, &m.decided)
	m.Own.MustRegister(m.Collectors()...)
	return m
}

// Reset clears the request-path series (the records, which the
// dashboard's counts are too) and the recent requests (tests).
func (m *Set) Reset() {
	m.recs.reset()
	m.recent.reset()
}

// Collectors lists every collector of the set.
func (m *Set) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Requests, m.Fleet, bodyBuffers{}, freeLists{}, usageLayouts{}}
}

// Register adds collectors to reg (a config's registry), tolerating
// collectors that are already there (several ramjet modules in one
// config).
func Register(reg prometheus.Registerer, collectors ...prometheus.Collector) error {
	for _, c := range collectors {
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

// OutcomeOf classifies a finished request.
func OutcomeOf(status int, canceled, noReplica bool) string {
	return outcomes[outcomeOf(status, canceled, noReplica)]
}

// outcomeOf is OutcomeOf as an index into outcomes.
func outcomeOf(status int, canceled, noReplica bool) int {
	switch {
	case noReplica:
		return 3
	case canceled:
		return 4
	case status >= 500 || status == 0:
		return 2
	case status >= 400:
		return 1
	}
	return 0
}

// reasonLabels are the reason label's values: selection.Reason's names by
// value, then "fallback".
var reasonLabels = [...]string{"none", "affinity", "load_override", "cold", "tie_break", "panic", "fallback"}

// Fails to compile when selection.Reason outgrows reasonLabels.
var _ [len(reasonLabels) - 2 - int(selection.ReasonPanic)]struct{}

// ReasonLabel is the reason label of a decision.
func ReasonLabel(d selection.Decision, fallback bool) string {
	return reasonLabels[reasonOf(d, fallback)]
}

// reasonOf is ReasonLabel as an index into reasonLabels.
func reasonOf(d selection.Decision, fallback bool) int {
	switch {
	case fallback:
		return len(reasonLabels) - 1
	case d.Index < 0:
		return 0
	}
	return int(d.Reason)
}

// ObserveSelection records one routing decision of the policy and the time
// it took.
func (m *Set) ObserveSelection(upstream string, d selection.Decision, fallback bool, took time.Duration) {
	m.recs.decide(m.recs.up(upstream), reasonOf(d, fallback))
	if fallback || d.Index < 0 {
		return
	}
	m.decided.sel.observe(selectBounds, took.Seconds())
	m.decided.overlap.observe(overlapBounds, float64(d.Overlap))
	if d.Tie > selection.TieNone {
		m.recs.tie(d.Tie)
	}
}

// Exchange is what the metrics learn about one finished request.
type Exchange struct {
	Fleet    string
	Upstream string // opaque route id, "" when none was chosen
	Model    string // the request's model name, "" when unknown
	Status   int
	Canceled bool
	// NoReplica: ramjet answered 503 because no replica was usable.
	NoReplica bool
	Stream    bool
	Start     time.Time
	FirstByte time.Time // zero when no body byte was written, and for a response that is not a stream (its only reader is the TTFT of a stream)
	End       time.Time
	Usage     usage.Usage
	HasUsage  bool

	Decision selection.Decision
	Fallback bool
	Selected bool // a policy decision was made for the request
}

// Inflight is a request counted in flight (StartRequest), for EndRequest.
type Inflight struct {
	p     *pairRecord // the pair it is counted in flight on: (upstream, model label)
	known bool        // the label is the model's own name: it was in Models (which only grow)
}

// StartRequest counts a request in flight for model on the pair of
// upstream (its first attempt's, "" for none) and model's label, and
// returns what to pass to EndRequest, which counts it on that pair when
// it ends there under that label (no second lookup).
func (m *Set) StartRequest(upstream, model string) Inflight {
	l := m.Models.Label(model)
	p := m.recs.get(upstream, l)
	m.recs.mark(&p.seen, seenInflight, nil)
	p.inflight.Add(1)
	return Inflight{p, l == model && model != "" && model != catalog.Other}
}

// EndRequest records a finished request; in is what StartRequest
// returned.
func (m *Set) EndRequest(in Inflight, x *Exchange) { m.end(in, x) }

// end is EndRequest; it returns the request's model label and outcome
// (an index into outcomes).
func (m *Set) end(in Inflight, x *Exchange) (model string, oi int) {
	in.p.inflight.Add(-1)
	oi = outcomeOf(x.Status, x.Canceled, x.NoReplica)
	outcome := outcomes[oi]
	switch {
	case in.known && x.Model == in.p.model:
		model = x.Model // in Models at the start, so still: what Add and Label return
	case outcome == OutcomeOK:
		model = m.Models.Add(x.Model)
	default:
		model = m.Models.Label(x.Model)
	}
	p := in.p
	if p.upstream != x.Upstream || p.model != model { // a retry went elsewhere, or the label changed
		p = m.recs.get(x.Upstream, model)
	}
	m.recs.end(p, oi, x)
	return model, oi
}

// Finish records a finished request: a routed one (x.Selected) under
// in, what StartRequest returned, and among the recent ones; an LLM
// request (llm) answered before any routing (malformed, unknown model,
// too large) counts too, with no upstream.
func (m *Set) Finish(x *Exchange, in Inflight, llm bool) {
	switch {
	case x.Selected:
		model, oi := m.end(in, x)
		m.recent.add(x, model, oi)
	case llm:
		m.EndRequest(m.StartRequest(x.Upstream, x.Model), x)
	}
}

// recent keeps the last dashboard.RecentLen routed requests as their
// exchanges with what EndRequest found (model label, outcome): a request
// copies its exchange, and the dashboard's records are made when the list
// is read (RecentRecords), not on the request path.
type recent struct {
	mu      sync.Mutex
	buf     [dashboard.RecentLen]recentExchange
	next, n int
}

type recentExchange struct {
	x     Exchange
	model string
	oi    int
}

func (r *recent) add(x *Exchange, model string, oi int) {
	r.mu.Lock()
	e := &r.buf[r.next]
	e.x, e.model, e.oi = *x, model, oi
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
	r.mu.Unlock()
}

func (r *recent) reset() {
	r.mu.Lock()
	r.next, r.n = 0, 0
	r.mu.Unlock()
}

// RecentRecords returns the dashboard's records of the last routed
// requests, newest first.
func (m *Set) RecentRecords() []dashboard.Record {
	r := &m.recent
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]dashboard.Record, 0, r.n)
	for i := 1; i <= r.n; i++ {
		e := &r.buf[(r.next-i+len(r.buf))%len(r.buf)]
		out = append(out, record(&e.x, e.model, outcomes[e.oi]))
	}
	return out
}

// record is the dashboard's view of an exchange whose model label and
// outcome EndRequest found.
func record(x *Exchange, model, outcome string) dashboard.Record {
	d := x.Decision
	rec := dashboard.Record{
		Time: x.Start.UnixMilli(), Fleet: x.Fleet, Upstream: x.Upstream,
		Model:  model,
		Reason: ReasonLabel(d, x.Fallback), Overlap: d.Overlap, BestOverlap: d.BestOverlap,
		Load: d.Load, Usable: d.Usable, Outcome: outcome,
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

// DashboardSample is the dashboard's view of m and the live fleets now
// (a dashboard.Store's sampler).
func (m *Set) DashboardSample(now time.Time) dashboard.Sample {
	var g dashboard.Gauges
	for _, f := range m.snap() {
		g.Index.Bytes += float64(f.IndexBytes)
		g.Index.Budget += float64(f.IndexBudget)
		g.Index.Entries += float64(f.IndexEntries)
		seen := make(map[string]bool, len(f.Replicas))
		for _, r := range f.Replicas {
			if r.ID == "" || seen[r.ID] {
				continue
			}
			seen[r.ID] = true
			g.Replicas = append(g.Replicas, dashboard.Replica{ID: r.ID, Fleet: f.Key,
				Inflight: float64(r.Inflight), Pending: float64(r.PendingPrefill), Load: r.Load,
				Healthy: r.Healthy, Available: r.Available, Quarantined: r.Quarantined})
		}
	}
	g.Ended, g.Decided, g.TTFT = m.recs.dashboard()
	return dashboard.SampleOf(now, g)
}

// monoBase is the origin of MonoNow.
var monoBase = time.Now()

// MonoNow is the monotonic clock as a duration since the process's start:
// one clock read (time.Since), where time.Now reads the wall clock too
// (about 100 ns against 26 on the 2-core benchmark machine). For
// durations only (the selection time).
func MonoNow() time.Duration { return time.Since(monoBase) }
