package latency

import (
	"sync"
	"time"
)

// Hist is a fixed-bucket histogram of durations, in seconds. Safe for
// concurrent use.
type Hist struct {
	bounds  []float64
	mu      sync.Mutex
	counts  []uint64
	sum     float64
	samples uint64
}

// New returns an empty histogram over the upper bounds (seconds, sorted
// ascending).
func New(bounds []float64) *Hist {
	return &Hist{bounds: bounds, counts: make([]uint64, len(bounds))}
}

// Observe records one duration.
func (h *Hist) Observe(d time.Duration) {
	sec := d.Seconds()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, b := range h.bounds {
		if sec <= b {
			h.counts[i]++
		}
	}
	h.sum += sec
	h.samples++
}

// Snapshot returns the cumulative count per upper bound, the sum in
// seconds and the number of samples, as a Prometheus histogram wants
// them.
func (h *Hist) Snapshot() (map[float64]uint64, float64, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[float64]uint64, len(h.bounds))
	for i, b := range h.bounds {
		m[b] = h.counts[i]
	}
	return m, h.sum, h.samples
}
