package fleetsim

import (
	"testing"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestRamjetPreciseOwnScale: the own=K probe scales the precise index's
// own-block memory (kvindex.Config.MaxPredicted and MaxOwnGone): at a
// tiny K predictions are dropped at the bound and the remembered pairs
// stay under 4 x it; without the key (the defaults) none is dropped.
func TestRamjetPreciseOwnScale(t *testing.T) {
	run := func(name string) *RamjetPrecise {
		t.Helper()
		w := generate(t, "shared-prefix", workload.Options{Seed: 2, Scale: 0.1})
		q, err := NewPolicy(name, 2, selection.Config{})
		if err != nil {
			t.Fatal(err)
		}
		p := q.(*RamjetPrecise)
		if _, err := Run(Config{Workload: w, Replicas: 4, Policy: p, Salt: 2}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := run("ramjet-precise@always"); p.pc.OwnScale != 0 || p.Index().PredictionsDropped() != 0 {
		t.Fatalf("default: OwnScale %v, %d predictions dropped, want 0 and 0", p.pc.OwnScale, p.Index().PredictionsDropped())
	}
	p := run("ramjet-precise@always+own=0.0001") // MaxPredicted 6, MaxOwnGone 24
	if p.pc.OwnScale != 0.0001 || p.Index().PredictionsDropped() == 0 || p.Index().OwnRemembered() > 24 {
		t.Fatalf("own=0.0001: OwnScale %v, %d predictions dropped (want > 0), %d pairs remembered (want <= 24)",
			p.pc.OwnScale, p.Index().PredictionsDropped(), p.Index().OwnRemembered())
	}
	if _, err := NewPolicy("ramjet-precise@own=x", 2, selection.Config{}); err == nil {
		t.Fatal("own=x accepted")
	}
}
