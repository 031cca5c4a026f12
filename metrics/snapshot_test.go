package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/snapshot"
)

func TestSnapshotMetricsLint(t *testing.T) {
	m := NewSnapshot()
	m.NoKey("default")
	for _, c := range m.Collectors() {
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
}

// TestSnapshotOutcomes: every load outcome of a fleet is exported once the
// fleet has a series, at zero, and fleets are counted apart.
func TestSnapshotOutcomes(t *testing.T) {
	m := NewSnapshot()
	m.NoKey("a")
	m.NoKey("b")
	want := 2 * (len(snapshot.Reasons) + 2) // loaded, no_key
	if got := testutil.CollectAndCount(m.Loads, "ramjet_snapshot_loads_total"); got != want {
		t.Errorf("%d load series, want %d", got, want)
	}
	for _, o := range []string{snapshot.Loaded, "missing", "incomplete", "too_old"} {
		if got := testutil.ToFloat64(m.Loads.WithLabelValues("a", o)); got != 0 {
			t.Errorf("loads{a,%s} = %v, want 0", o, got)
		}
	}
	if got := testutil.ToFloat64(m.Loads.WithLabelValues("a", string(snapshot.NoKey))); got != 1 {
		t.Errorf("loads{a,no_key} = %v, want 1", got)
	}
	if got := testutil.CollectAndCount(m.Writes, "ramjet_snapshot_writes_total"); got != 4 {
		t.Errorf("%d write series, want 4 (ok, error per fleet)", got)
	}
}
