package dashboard

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

// TestDecisionsHotCache: Decisions, through its cache by string address,
// returns the map's counter of the key asked, with many keys (entries
// shared) and with equal strings at other addresses; after Reset, new
// counters.
func TestDecisionsHotCache(t *testing.T) {
	r := NewRecorder()
	ups, reasons := make([]string, 40), []string{"affinity", "cold", "load_override"}
	for i := range ups {
		ups[i] = fmt.Sprintf("%04x", i)
	}
	first := map[decisionKey]*Count{}
	for round := range 3 {
		for _, u := range ups {
			for _, why := range reasons {
				if round == 2 {
					u, why = strings.Clone(u), strings.Clone(why) // same text, other addresses
				}
				c := r.Decisions(u, why)
				k := decisionKey{u, why}
				if c.key != k || (*r.decisions.m.Load())[k] != c {
					t.Fatalf("Decisions(%q, %q) is not the map's counter of the key (its key %+v)", u, why, c.key)
				}
				if round == 0 {
					first[k] = c
				} else if first[k] != c {
					t.Fatalf("Decisions(%q, %q) changed between calls", u, why)
				}
			}
		}
	}
	r.Reset()
	for k, old := range first {
		if c := r.Decisions(k.upstream, k.reason); c == old {
			t.Fatalf("Decisions(%q, %q) after Reset is the counter from before", k.upstream, k.reason)
		}
	}
}

// TestInflightHotCache: Inflight, through its cache by string address,
// returns the map's counter of the model asked, also for equal strings at
// other addresses; after Reset, new counters.
func TestInflightHotCache(t *testing.T) {
	r := NewRecorder()
	models := make([]string, 100)
	for i := range models {
		models[i] = fmt.Sprintf("model-%d", i)
	}
	first := map[string]*inflightCount{}
	for round := range 3 {
		for _, m := range models {
			if round == 2 {
				m = strings.Clone(m)
			}
			n := r.Inflight(m)
			c := (*r.inflight.m.Load())[m]
			if c == nil || &c.n != n || c.model != m {
				t.Fatalf("Inflight(%q) is not the map's counter of the model", m)
			}
			if round == 0 {
				first[m] = c
			} else if first[m] != c {
				t.Fatalf("Inflight(%q) changed between calls", m)
			}
		}
	}
	r.Inflight("model-1").Add(2)
	got := map[string]int64{}
	r.EachInflight(func(m string, c *atomic.Int64) { got[m] = c.Load() })
	if len(got) != len(models) || got["model-1"] != 2 {
		t.Fatalf("EachInflight saw %d models, model-1 at %d; want %d, 2", len(got), got["model-1"], len(models))
	}
	r.Reset()
	for m, old := range first {
		if n := r.Inflight(m); n == &old.n {
			t.Fatalf("Inflight(%q) after Reset is the counter from before", m)
		}
	}
}
