package snapshot

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the collectors Writers update, every series labelled with
// its fleet (the policy's state key: one process may run several fleets,
// each with its own snapshot). Package metrics creates them:
// metrics.Snapshot.
type Metrics struct {
	// Loads counts snapshots read at start by fleet and outcome: Loaded,
	// NoKey or a Reason.
	Loads *prometheus.CounterVec
	// Writes counts snapshots written by fleet and outcome (ok, error).
	Writes *prometheus.CounterVec
	// Dropped counts the replicas of loaded snapshots not in the pool.
	Dropped *prometheus.CounterVec
	// Loaded is the beliefs the last loaded snapshot restored.
	Loaded *prometheus.GaugeVec
	// LastWrite is when the last snapshot was written (Unix seconds),
	// Bytes its size.
	LastWrite *prometheus.GaugeVec
	Bytes     *prometheus.GaugeVec
}

// Collectors are m's collectors, for registration.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Loads, m.Writes, m.Dropped, m.Loaded, m.LastWrite, m.Bytes}
}

// Outcomes are every load outcome: Loaded, NoKey and the Reasons.
func Outcomes() []string {
	out := []string{Loaded, string(NoKey)}
	for _, r := range Reasons {
		out = append(out, string(r))
	}
	return out
}

// fleetMetrics are one fleet's series of Metrics.
type fleetMetrics struct {
	loads, writes               *prometheus.CounterVec // by outcome
	dropped                     prometheus.Counter
	loaded, lastWrite, bytesNow prometheus.Gauge
}

// fleet creates fleet's series, every outcome present from the start.
func (m *Metrics) fleet(fleet string) fleetMetrics {
	l := prometheus.Labels{"fleet": fleet}
	f := fleetMetrics{loads: m.Loads.MustCurryWith(l), writes: m.Writes.MustCurryWith(l),
		dropped: m.Dropped.With(l), loaded: m.Loaded.With(l), lastWrite: m.LastWrite.With(l), bytesNow: m.Bytes.With(l)}
	for _, o := range Outcomes() {
		f.loads.WithLabelValues(o)
	}
	f.writes.WithLabelValues("ok")
	f.writes.WithLabelValues("error")
	return f
}

// NoKey counts a fleet whose snapshots are off because the key is
// missing or too short.
func (m *Metrics) NoKey(fleet string) {
	m.fleet(fleet).loads.WithLabelValues(string(NoKey)).Inc()
}
