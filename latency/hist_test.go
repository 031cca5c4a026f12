package latency

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestHist(t *testing.T) {
	h := New([]float64{0.01, 0.1, 1})
	for _, d := range []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond, 2 * time.Second} {
		h.Observe(d)
	}
	b, sum, n := h.Snapshot()
	want := map[float64]uint64{0.01: 2, 0.1: 3, 1: 3}
	if diff := cmp.Diff(want, b); diff != "" {
		t.Fatalf("buckets (-want +got):\n%s", diff)
	}
	if n != 4 || sum < 2.064 || sum > 2.066 {
		t.Fatalf("sum %v count %d, want 2.065 and 4", sum, n)
	}
}
