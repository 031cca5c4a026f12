package loadgen

import (
	"math"
	"testing"
	"time"
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
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	d := distOf(s)
	if d.Count != 100 || d.P50 != 50 || d.P99 != 99 || d.Max != 100 || d.Mean != 50.5 {
		t.Fatalf("got %+v", d)
	}
	if (distOf(nil) != Dist{}) {
		t.Fatal("empty dist not zero")
	}
}
