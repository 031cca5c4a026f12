package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/integrity"
)

// IntegritySource is one fleet's integrity checks, as the integrity
// collector reads them.
type IntegritySource struct {
	// Fleet is the fleet's state_key.
	Fleet   string
	Monitor *integrity.Monitor
	// RouteID is the opaque route id of a replica key, "" when not routed
	// yet (its series are then left out).
	RouteID func(key string) string
}

// ShadowSource is one fleet's session shadow, as the collector reads it.
type ShadowSource struct {
	Fleet  string
	Shadow *integrity.SessionShadow
}

// The label sets of the integrity series, as the fleet series.
var (
	integFleetLabels   = []string{"fleet"}
	integReplicaLabels = []string{"fleet", "upstream"}
)

// The integrity series (labels as every ramjet series: fleet, the opaque
// upstream id, and fixed sets).
var (
	descIntegOut = prometheus.NewDesc("ramjet_integrity_out",
		"1 when engine integrity holds the upstream out of routing (admission failed, or quarantined in enforce mode), else 0.", integReplicaLabels, nil)
	descIntegReason = prometheus.NewDesc("ramjet_integrity_reason",
		"1 for the upstream's current integrity reason (pending, unreachable, bad_status, malformed, partial, model_mismatch, template_mismatch, tokenizer_mismatch, spec_collapse, fenced); absent when none.", append(integReplicaLabels, "reason"), nil)
	descIntegChecks = prometheus.NewDesc("ramjet_integrity_checks_total",
		"Identity checks of the upstream, by result (ok: complete and matching every pin; failed).", append(integReplicaLabels, "result"), nil)
	descSpecQuarantined = prometheus.NewDesc("ramjet_spec_decode_quarantined",
		"1 when enforce mode quarantines the upstream for speculative acceptance collapse (or a fenced instance), else 0.", integReplicaLabels, nil)
	descSpecObserved = prometheus.NewDesc("ramjet_spec_decode_collapse_observed",
		"1 when observe mode sees the upstream's speculative acceptance collapsed, else 0.", integReplicaLabels, nil)
	descSpecStreak = prometheus.NewDesc("ramjet_spec_decode_zero_acceptance_windows",
		"Consecutive complete windows with draft tokens and no accepted token.", integReplicaLabels, nil)
	descSpecRatio = prometheus.NewDesc("ramjet_spec_decode_acceptance_ratio",
		"Accepted over draft tokens in the upstream's last complete window with drafts.", integReplicaLabels, nil)
	descShadowSessions = prometheus.NewDesc("ramjet_session_shadow_sessions",
		"Sessions the session-sticky shadow remembers (bounded by max_sessions).", integFleetLabels, nil)
	descIntegWrites = prometheus.NewDesc("ramjet_integrity_state_writes_total",
		"Durable writes of quarantine commitments to the state file, by result (ok, failed).", append(integFleetLabels, "result"), nil)
)

// Shadow holds the session shadow's request-path series.
type Shadow struct {
	Decisions     *prometheus.CounterVec
	Overlap, Load *prometheus.HistogramVec
}

func newShadow() *Shadow {
	return &Shadow{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ramjet", Name: "session_shadow_decisions_total",
			Help: "Requests with a session key, by how a session-sticky policy's choice compares with ramjet's (new, agree, disagree, sticky_unavailable)."},
			[]string{"fleet", "outcome"}),
		Overlap: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ramjet", Name: "session_shadow_overlap_tokens",
			Help:    "On a disagreement, the estimated prefix overlap of ramjet's and of the sticky policy's choice (choice: ramjet, sticky), in tokens.",
			Buckets: []float64{0, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768}}, []string{"fleet", "choice"}),
		Load: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "ramjet", Name: "session_shadow_load_tokens",
			Help:    "On a disagreement, the live load of ramjet's and of the sticky policy's choice (choice: ramjet, sticky), in tokens.",
			Buckets: prometheus.ExponentialBuckets(256, 4, 8)}, []string{"fleet", "choice"}),
	}
}

// Disagree records a disagreement's overlap and load of both choices.
func (m *Shadow) Disagree(fleet string, overlap, stickyOverlap int, load, stickyLoad float64) {
	m.Overlap.WithLabelValues(fleet, "ramjet").Observe(float64(overlap))
	m.Overlap.WithLabelValues(fleet, "sticky").Observe(float64(stickyOverlap))
	m.Load.WithLabelValues(fleet, "ramjet").Observe(load)
	m.Load.WithLabelValues(fleet, "sticky").Observe(stickyLoad)
}

// IntegrityCollector exports engine integrity's and the session shadow's
// series, reading the live sources at every scrape. Create it once and
// register it into every config's registry.
type IntegrityCollector struct {
	// Shadow is the session shadow's request-path series.
	Shadow *Shadow
	integ  func() []IntegritySource
	shadow func() []ShadowSource
}

// NewIntegrityCollector returns the collector reading integ and shadow.
func NewIntegrityCollector(integ func() []IntegritySource, shadow func() []ShadowSource) *IntegrityCollector {
	return &IntegrityCollector{Shadow: newShadow(), integ: integ, shadow: shadow}
}

// Describe implements prometheus.Collector.
func (c *IntegrityCollector) Describe(ch chan<- *prometheus.Desc) {
	c.Shadow.Decisions.Describe(ch)
	c.Shadow.Overlap.Describe(ch)
	c.Shadow.Load.Describe(ch)
	for _, d := range []*prometheus.Desc{descShadowSessions, descIntegOut, descIntegReason, descIntegChecks,
		descSpecQuarantined, descSpecObserved, descSpecStreak, descSpecRatio, descIntegWrites} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *IntegrityCollector) Collect(ch chan<- prometheus.Metric) {
	c.Shadow.Decisions.Collect(ch)
	c.Shadow.Overlap.Collect(ch)
	c.Shadow.Load.Collect(ch)
	for _, s := range c.shadow() {
		ch <- prometheus.MustNewConstMetric(descShadowSessions, prometheus.GaugeValue, float64(s.Shadow.Len()), s.Fleet)
	}
	for _, s := range c.integ() {
		collectIntegrity(ch, s)
	}
}

func collectIntegrity(ch chan<- prometheus.Metric, s IntegritySource) {
	gauge := func(d *prometheus.Desc, v float64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	counter := func(d *prometheus.Desc, v uint64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	_, spec := s.Monitor.Mode()
	if spec {
		ok, failed := s.Monitor.Writes()
		counter(descIntegWrites, ok, s.Fleet, "ok")
		counter(descIntegWrites, failed, s.Fleet, "failed")
	}
	for _, st := range s.Monitor.Statuses() {
		id := s.RouteID(st.Key)
		if id == "" {
			continue
		}
		gauge(descIntegOut, boolGauge(st.Out), s.Fleet, id)
		if st.Reason != "" {
			gauge(descIntegReason, 1, s.Fleet, id, string(st.Reason))
		}
		counter(descIntegChecks, st.ChecksOK, s.Fleet, id, "ok")
		counter(descIntegChecks, st.ChecksFailed, s.Fleet, id, "failed")
		if spec {
			gauge(descSpecQuarantined, boolGauge(st.Quarantined), s.Fleet, id)
			gauge(descSpecObserved, boolGauge(st.Observed), s.Fleet, id)
			gauge(descSpecStreak, float64(st.Streak), s.Fleet, id)
			if st.Ratio >= 0 {
				gauge(descSpecRatio, st.Ratio, s.Fleet, id)
			}
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var _ prometheus.Collector = (*IntegrityCollector)(nil)
