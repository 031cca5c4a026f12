package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/snapshot"
)

func TestSnapshotMetricsLint(t *testing.T) {
	for _, c := range Snapshot().Collectors() {
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
}

// TestSnapshotOutcomes: every load outcome is exported from the start, at
// zero.
func TestSnapshotOutcomes(t *testing.T) {
	m := NewSnapshot()
	want := len(snapshot.Reasons) + 2 // loaded, no_key
	if got := testutil.CollectAndCount(m.Loads, "ramjet_snapshot_loads_total"); got != want {
		t.Errorf("%d load outcomes, want %d", got, want)
	}
	for _, o := range append([]string{snapshot.Loaded, string(snapshot.NoKey)}, "missing", "too_old") {
		if got := testutil.ToFloat64(m.Loads.WithLabelValues(o)); got != 0 {
			t.Errorf("loads{%s} = %v, want 0", o, got)
		}
	}
	if got := testutil.CollectAndCount(m.Writes, "ramjet_snapshot_writes_total"); got != 2 {
		t.Errorf("%d write outcomes, want 2 (ok, error)", got)
	}
}
