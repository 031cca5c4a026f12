package kvindex

import (
	"sync"
	"time"
)

// LatencyBuckets are the upper bounds, in seconds, of LatencyHist's
// buckets.
var LatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .075, .1, .15, .2, .25, .5, 1, 2}

// LatencyHist is a fixed-bucket histogram of latencies (the tokenize
// preflight's: TokenizerConfig.OnLatency), read by a metrics collector.
// Safe for concurrent use.
type LatencyHist struct {
	mu      sync.Mutex
	counts  []uint64
	sum     float64
	samples uint64
}

// NewLatencyHist returns an empty histogram over LatencyBuckets.
func NewLatencyHist() *LatencyHist {
	return &LatencyHist{counts: make([]uint64, len(LatencyBuckets))}
}

// Observe records one latency.
func (h *LatencyHist) Observe(d time.Duration) {
	sec := d.Seconds()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, b := range LatencyBuckets {
		if sec <= b {
			h.counts[i]++
		}
	}
	h.sum += sec
	h.samples++
}

// Snapshot returns the cumulative count per bucket upper bound, the sum
// in seconds and the number of samples, as a Prometheus histogram wants
// them.
func (h *LatencyHist) Snapshot() (map[float64]uint64, float64, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[float64]uint64, len(LatencyBuckets))
	for i, b := range LatencyBuckets {
		m[b] = h.counts[i]
	}
	return m, h.sum, h.samples
}
