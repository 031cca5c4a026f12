package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/snapshot"
)

// Snapshot is the index snapshot metrics (ramjet_snapshot_*), created once
// and registered into every config's registry. A fleet's series appear
// when its snapshot writer starts, every outcome at zero.
var Snapshot = sync.OnceValue(NewSnapshot)

// NewSnapshot creates the index snapshot metrics.
func NewSnapshot() *snapshot.Metrics {
	fleet := []string{"fleet"}
	return &snapshot.Metrics{
		Loads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ramjet_snapshot_loads_total",
			Help: "Index snapshots read at start, by fleet and outcome: loaded, or why ramjet started cold (missing, incomplete, tampered, shape_mismatch, too_old, too_large, unreadable, no_key)."},
			[]string{"fleet", "outcome"}),
		Writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ramjet_snapshot_writes_total",
			Help: "Index snapshots written, by fleet and outcome (ok, error)."}, []string{"fleet", "outcome"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ramjet_snapshot_dropped_replicas_total",
			Help: "Replicas of a loaded snapshot left out because they are not in the upstream pool."}, fleet),
		Loaded: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ramjet_snapshot_loaded_blocks",
			Help: "(block, replica) beliefs the last loaded snapshot restored."}, fleet),
		LastWrite: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ramjet_snapshot_last_write_timestamp_seconds",
			Help: "When the last snapshot was written, in seconds since the epoch."}, fleet),
		Bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ramjet_snapshot_bytes",
			Help: "Size of the last snapshot written, in bytes."}, fleet),
	}
}
