package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/fleetstate"
)

// The learn queue's counters are exported per fleet, as the snapshot
// reads them from the index, and lint clean.
func TestFleetCollectorLearnQueue(t *testing.T) {
	c := NewFleetCollector(func() []fleetstate.Snapshot {
		return []fleetstate.Snapshot{{Key: "a", IndexLearnsQueued: 7, IndexLearnsInline: 2}}
	})
	want := `
# HELP ramjet_index_learns_inline_total Learns of queueing size made on the request path because the index's learn queue was full (none is ever dropped).
# TYPE ramjet_index_learns_inline_total counter
ramjet_index_learns_inline_total{fleet="a"} 2
# HELP ramjet_index_learns_queued_total Learns the approximate index applied off the request path (its learn queue: prompts with many blocks new to the chosen replica).
# TYPE ramjet_index_learns_queued_total counter
ramjet_index_learns_queued_total{fleet="a"} 7
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "ramjet_index_learns_queued_total", "ramjet_index_learns_inline_total"); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}
