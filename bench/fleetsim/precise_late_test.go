package fleetsim

import (
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestRamjetPreciseMissedPreflights: with a share of preflights missing
// their timeout, those requests are routed by the estimate, and (unless
// NoLate) their late answers hold the chosen replica's blocks until the
// request ends; predictions of requests that ended are released, so none
// is left once every request finished.
func TestRamjetPreciseMissedPreflights(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 2, Scale: 0.1})
	run := func(pc PreciseConfig) *RamjetPrecise {
		p, err := NewRamjetPrecise(selection.Config{}, pc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(Config{Workload: w, Replicas: 4, Policy: p, Salt: 2}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	late := run(PreciseConfig{TokenizeMiss: 0.25})
	noLate := run(PreciseConfig{TokenizeMiss: 0.25, NoLate: true})
	n := len(w.Trace)
	if late.Misses*8 < n || late.Misses*3 > n {
		t.Errorf("%d of %d preflights missed, want about a quarter", late.Misses, n)
	}
	if late.LateHolds == 0 || noLate.LateHolds != 0 {
		t.Errorf("late holds %d (want > 0), without late answers %d (want 0)", late.LateHolds, noLate.LateHolds)
	}
	if late.PreciseDecisions()+late.ApproxDecisions()+late.Misses != n {
		t.Errorf("precise %d + approximate %d + missed %d decisions, want %d", late.PreciseDecisions(), late.ApproxDecisions(), late.Misses, n)
	}
	// Every request ended: what is still predicted is in its grace, and
	// past it nothing is.
	if len(late.held) != 0 || len(late.routed) != 0 {
		t.Errorf("%d holds and %d routed requests left after the run", len(late.held), len(late.routed))
	}
	late.clock += DefaultPredictGrace + time.Second
	if got := late.Index().Predicted(); got != 0 {
		t.Errorf("%d predictions left past the grace after every request ended", got)
	}
	if _, err := NewRamjetPrecise(selection.Config{}, PreciseConfig{TokenizeMiss: 1.5}); err == nil {
		t.Error("a tokenize miss share of 1.5 was accepted")
	}
}
