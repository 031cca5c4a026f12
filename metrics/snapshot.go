package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/snapshot"
)

// Snapshot is the index snapshot metrics (ramjet_snapshot_*), created once
// and registered into every config's registry.
var Snapshot = sync.OnceValue(NewSnapshot)

// NewSnapshot creates the index snapshot metrics, every outcome label
// present from the start.
func NewSnapshot() *snapshot.Metrics {
	m := &snapshot.Metrics{
		Loads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ramjet_snapshot_loads_total",
			Help: "Index snapshots read at start, by outcome: loaded, or why ramjet started cold (missing, tampered, shape_mismatch, too_old, too_large, unreadable, no_key)."},
			[]string{"outcome"}),
		Writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ramjet_snapshot_writes_total",
			Help: "Index snapshots written, by outcome (ok, error)."}, []string{"outcome"}),
		Dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "ramjet_snapshot_dropped_replicas_total",
			Help: "Replicas of a loaded snapshot left out because they are not in the upstream pool."}),
		Loaded: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ramjet_snapshot_loaded_blocks",
			Help: "(block, replica) beliefs the last loaded snapshot restored."}),
		LastWrite: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ramjet_snapshot_last_write_timestamp_seconds",
			Help: "When the last snapshot was written, in seconds since the epoch."}),
		Bytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ramjet_snapshot_bytes",
			Help: "Size of the last snapshot written, in bytes."}),
	}
	m.Loads.WithLabelValues(snapshot.Loaded)
	m.Loads.WithLabelValues(string(snapshot.NoKey))
	for _, r := range snapshot.Reasons {
		m.Loads.WithLabelValues(string(r))
	}
	m.Writes.WithLabelValues("ok")
	m.Writes.WithLabelValues("error")
	return m
}
