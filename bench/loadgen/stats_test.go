package loadgen

import (
	"math"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/stats"
)

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Millisecond)
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0, time.Millisecond}, {0.5, 500 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {1, time.Second}} {
		got := h.Quantile(tt.q)
		if rel := math.Abs(float64(got-tt.want)) / float64(tt.want); rel > 0.011 {
			t.Errorf("q%.2f = %v, want %v within 1.1%%", tt.q, got, tt.want)
		}
	}
	if m := h.Mean(); m < 500*time.Millisecond || m > 501*time.Millisecond {
		t.Errorf("mean %v", m)
	}
	var o Histogram
	o.Record(2 * time.Hour) // clamped into the last bucket, max stays exact
	h.Merge(&o)
	if h.Count() != 1001 || h.Quantile(1) != 2*time.Hour {
		t.Errorf("after merge: count %d max %v", h.Count(), h.Quantile(1))
	}
}

func TestDistOf(t *testing.T) {
	var d durations
	for i := 100; i >= 1; i-- {
		d.add(time.Duration(i) * time.Millisecond)
	}
	// stats.Percentile over 1..100 ms: p50 at position 49.5 -> 50.5 ms,
	// p99 at 98.01 -> 99.01 ms.
	got := distOf(&d)
	want := Dist{Count: 100, Mean: 50.5, P50: 50.5, P90: 90.1, P95: 95.05, P99: 99.01, Max: 100}
	for _, f := range []struct {
		name      string
		got, want float64
	}{{"count", float64(got.Count), float64(want.Count)}, {"mean", got.Mean, want.Mean}, {"p50", got.P50, want.P50},
		{"p90", got.P90, want.P90}, {"p95", got.P95, want.P95}, {"p99", got.P99, want.P99}, {"max", got.Max, want.Max}} {
		if math.Abs(f.got-f.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
		}
	}
	if (distOf(&durations{}) != Dist{}) {
		t.Fatal("empty dist not zero")
	}
}

// TestHistogramMatchesPercentile: the histogram's quantiles follow
// stats.Percentile's definition, within the bucket precision.
func TestHistogramMatchesPercentile(t *testing.T) {
	var h Histogram
	var xs []float64
	for i := 1; i <= 10; i++ {
		d := time.Duration(i*i) * time.Millisecond
		h.Record(d)
		xs = append(xs, float64(d))
	}
	for _, q := range []float64{0.1, 0.25, 0.5, 0.9, 0.95, 0.99} {
		want := stats.Percentile(xs, 100*q)
		if got := float64(h.Quantile(q)); math.Abs(got-want)/want > 0.011 {
			t.Errorf("q%.2f = %v, want %v within 1.1%%", q, time.Duration(got), time.Duration(want))
		}
	}
}
