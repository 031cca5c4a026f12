package kvindex

import "testing"

func TestPreflightReportWithin(t *testing.T) {
	r := PreflightReport{Sent: 4, Bounds: []float64{.05, .1}, Buckets: []uint64{1, 3}}
	tests := []struct {
		give float64
		want float64
	}{{.05, .25}, {.1, .75}, {.2, -1}}
	for _, tt := range tests {
		if got := r.Within(tt.give); got != tt.want {
			t.Errorf("Within(%v) = %v, want %v", tt.give, got, tt.want)
		}
	}
	if got := (PreflightReport{}).Within(.05); got != -1 {
		t.Errorf("none sent: %v, want -1", got)
	}
}
