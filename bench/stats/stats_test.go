package stats

import (
	"math"
	"testing"
)

func TestPercentile(t *testing.T) {
	tests := []struct {
		name string
		give []float64
		p    float64
		want float64
	}{
		// Hand-computed: position h = p/100 * (n-1).
		{name: "one value", give: []float64{7}, p: 95, want: 7},
		{name: "min", give: []float64{1, 2, 3, 4, 5}, p: 0, want: 1},
		{name: "max", give: []float64{1, 2, 3, 4, 5}, p: 100, want: 5},
		{name: "median odd", give: []float64{1, 2, 3, 4, 5}, p: 50, want: 3},
		{name: "p25 on a rank", give: []float64{1, 2, 3, 4, 5}, p: 25, want: 2},
		// h = 0.9*4 = 3.6: 4 + 0.6*(5-4).
		{name: "p90 between ranks", give: []float64{1, 2, 3, 4, 5}, p: 90, want: 4.6},
		// h = 0.5*3 = 1.5: 20 + 0.5*(30-20).
		{name: "median even", give: []float64{10, 20, 30, 40}, p: 50, want: 25},
		// h = 0.95*9 = 8.55: 9 + 0.55*(100-9) = 59.05.
		{name: "p95 with an outlier", give: []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 100}, p: 95, want: 59.05},
		// h = 0.99*19 = 18.81: 19 + 0.81*(20-19).
		{name: "p99 of 1..20", give: seq(20), p: 99, want: 19.81},
		{name: "ties", give: []float64{2, 2, 2, 2}, p: 37, want: 2},
		{name: "below 0 clamps", give: []float64{1, 2}, p: -5, want: 1},
		{name: "above 100 clamps", give: []float64{1, 2}, p: 120, want: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.give, tt.p); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.give, tt.p, got, tt.want)
			}
		})
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("Percentile(nil) = %v, want NaN", got)
	}
}

func seq(n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = float64(i + 1)
	}
	return xs
}

func TestSampleExactBelowCap(t *testing.T) {
	s := Sample{Cap: 100}
	for i := 100; i >= 1; i-- { // unsorted input
		s.Add(float64(i))
	}
	// h = 0.5*99 = 49.5: 50 + 0.5 = 50.5; h = 0.99*99 = 98.01: 99.01.
	for _, tt := range []struct{ p, want float64 }{{0, 1}, {50, 50.5}, {99, 99.01}, {100, 100}} {
		if got := s.Percentile(tt.p); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", tt.p, got, tt.want)
		}
	}
	s.Add(0) // past the cap: counted, sampled
	if s.Count() != 101 || len(s.xs) != 100 {
		t.Errorf("count %d kept %d, want 101 and 100", s.Count(), len(s.xs))
	}
	var empty Sample
	if !math.IsNaN(empty.Percentile(50)) {
		t.Error("empty sample percentile is not NaN")
	}
}

func TestSampleBoundedAndUniform(t *testing.T) {
	s := Sample{Cap: 1000}
	const n = 200000
	for i := range n {
		s.Add(float64(i))
	}
	if len(s.xs) != 1000 || s.Count() != n {
		t.Fatalf("kept %d of %d", len(s.xs), s.Count())
	}
	// A uniform sample of 0..n-1: the median is near n/2 (the standard
	// error of a 1000-sample median is about 1.6% of n; allow 5%).
	if got := s.Percentile(50); math.Abs(got-n/2) > 0.05*n {
		t.Errorf("median of the reservoir = %v, want about %v", got, n/2)
	}
}
