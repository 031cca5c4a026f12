package snapshot

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the collectors a Writer updates (package metrics creates
// them: metrics.Snapshot).
type Metrics struct {
	// Loads counts snapshots read at start by outcome: Loaded, NoKey or
	// a Reason.
	Loads *prometheus.CounterVec
	// Writes counts snapshots written by outcome (ok, error).
	Writes *prometheus.CounterVec
	// Dropped counts the replicas of loaded snapshots not in the pool.
	Dropped prometheus.Counter
	// Loaded is the beliefs the last loaded snapshot restored.
	Loaded prometheus.Gauge
	// LastWrite is when the last snapshot was written (Unix seconds),
	// Bytes its size.
	LastWrite prometheus.Gauge
	Bytes     prometheus.Gauge
}

// Collectors are m's collectors, for registration.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Loads, m.Writes, m.Dropped, m.Loaded, m.LastWrite, m.Bytes}
}
