package fleetsim

import (
	"testing"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestRamjetPreciseCapForeignQueueKey: ramjet-precise@capfq=K sets
// PreciseConfig.CapForeignQueue (kvindex's) to K; without it the default
// (0), capfq=0 turns it off (-1, the rule before); a bad value is
// rejected.
func TestRamjetPreciseCapForeignQueueKey(t *testing.T) {
	for _, tt := range []struct {
		name string
		want float64
	}{
		{"ramjet-precise", 0},
		{"ramjet-precise@capfq=0", -1},
		{"ramjet-precise@capfq=1", 1},
		{"ramjet-precise@wait+capfq=2.5", 2.5},
	} {
		q, err := NewPolicy(tt.name, 1, selection.Config{})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := q.(*RamjetPrecise).pc.CapForeignQueue; got != tt.want {
			t.Errorf("%s: CapForeignQueue %v, want %v", tt.name, got, tt.want)
		}
	}
	if _, err := NewPolicy("ramjet-precise@capfq=x", 1, selection.Config{}); err == nil {
		t.Error("ramjet-precise@capfq=x accepted")
	}
}
