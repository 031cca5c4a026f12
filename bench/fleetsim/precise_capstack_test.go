package fleetsim

import (
	"testing"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestRamjetPreciseCapStackKeys: ramjet-precise leaves CapLoad, CapPeer,
// CapGain and CapFit at 0, kvindex's defaults (the estimate cap's lift
// stack); each key sets its own field and leaves the others at theirs,
// and at 0 turns its field off (-1): capl=0 is the rule before (the
// estimate cap everywhere).
func TestRamjetPreciseCapStackKeys(t *testing.T) {
	for _, tt := range []struct {
		name             string
		load, peer, gain float64
		fleet            bool
		fit              float64
	}{
		{"ramjet-precise", 0, 0, 0, false, 0},
		{"ramjet-precise@capl=0", -1, 0, 0, false, 0},
		{"ramjet-precise@capl=3+capm=0+capg=0+capfit=0", 3, -1, -1, false, -1},
		{"ramjet-precise@capl=3+capm=1.1+capgf=0.75+capfit=2.5", 3, 1.1, 0.75, true, 2.5},
		{"ramjet-precise@capmn=0+capgm=0", 0, -1, -1, false, 0},
		{"ramjet-precise@capgf=0", 0, 0, -1, true, 0},
		{"ramjet-precise@capgr=0.5", 0, 0, 0.5, true, 0},
	} {
		q, err := NewPolicy(tt.name, 1, selection.Config{})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		pc := q.(*RamjetPrecise).pc
		if pc.CapLoad != tt.load || pc.CapPeer != tt.peer || pc.CapGain != tt.gain || pc.CapGainFleet != tt.fleet || pc.CapFit != tt.fit {
			t.Errorf("%s: CapLoad %v, CapPeer %v, CapGain %v, CapGainFleet %v, CapFit %v; want %v, %v, %v, %v, %v", tt.name,
				pc.CapLoad, pc.CapPeer, pc.CapGain, pc.CapGainFleet, pc.CapFit, tt.load, tt.peer, tt.gain, tt.fleet, tt.fit)
		}
	}
}
