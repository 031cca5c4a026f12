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

// Whether other instances show in the answers is exported per fleet.
func TestFleetCollectorOtherInstances(t *testing.T) {
	c := NewFleetCollector(func() []fleetstate.Snapshot {
		return []fleetstate.Snapshot{{Key: "a", OtherInstances: true}, {Key: "b"}}
	})
	want := `
# HELP ramjet_other_instances_seen 1 while the engines' answers (cached tokens past what this instance sent) show prompts other ramjet instances placed on the fleet's replicas, among the last 1024 answers: the agreement band is on; else 0.
# TYPE ramjet_other_instances_seen gauge
ramjet_other_instances_seen{fleet="a"} 1
ramjet_other_instances_seen{fleet="b"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "ramjet_other_instances_seen"); err != nil {
		t.Fatal(err)
	}
}

// The prompts' learned density is exported per fleet.
func TestFleetCollectorDensity(t *testing.T) {
	c := NewFleetCollector(func() []fleetstate.Snapshot {
		return []fleetstate.Snapshot{{Key: "a", Density: 2.75}, {Key: "b", Density: 4}}
	})
	want := `
# HELP ramjet_prompt_bytes_per_token The prompts' bytes per real token, learned from the engines' usage.prompt_tokens (chars_per_token before any answer); above chars_per_token the engines' KV capacities are applied to the index's estimated tokens at it.
# TYPE ramjet_prompt_bytes_per_token gauge
ramjet_prompt_bytes_per_token{fleet="a"} 2.75
ramjet_prompt_bytes_per_token{fleet="b"} 4
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "ramjet_prompt_bytes_per_token"); err != nil {
		t.Fatal(err)
	}
}
