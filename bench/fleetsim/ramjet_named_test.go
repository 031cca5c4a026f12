package fleetsim

import (
	"testing"

	"github.com/ramjet-llm/ramjet/selection"
)

// ramjet@outw=X sets output_weight, an explicit 0 included (the bonus
// off), and leaves ow to overflow_weight (ow=0 turns it off: -1; unset it
// is 0, selection.DefaultOverflowWeight).
func TestRamjetNamedOutputWeight(t *testing.T) {
	for _, tc := range []struct {
		name     string
		want     float64
		overflow float64
	}{
		{"ramjet", selection.DefaultOutputWeight, 0},
		{"ramjet@outw=0", 0, 0},
		{"ramjet@outw=2.5", 2.5, 0},
		{"ramjet@ow=1", selection.DefaultOutputWeight, 1},
		{"ramjet@ow=0", selection.DefaultOutputWeight, -1},
	} {
		p, err := NewPolicy(tc.name, 1, selection.Config{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r, ok := p.(*Ramjet)
		if !ok {
			t.Fatalf("%s: policy %T, want *Ramjet", tc.name, p)
		}
		if got := r.rt.Config().OutputWeight; got != tc.want {
			t.Errorf("%s: output_weight %v, want %v", tc.name, got, tc.want)
		}
		if got := r.rt.Options().OverflowWeight; got != tc.overflow {
			t.Errorf("%s: overflow_weight %v, want %v", tc.name, got, tc.overflow)
		}
	}
}

// ramjet@owhome=0 turns the home exemption off and ramjet@owroom=0 its
// gate (-1: none); unset both are 0, selection's defaults.
func TestRamjetNamedOverflowHome(t *testing.T) {
	for _, tc := range []struct {
		name       string
		home, room float64
	}{
		{"ramjet", 0, 0},
		{"ramjet@owhome=0", -1, 0},
		{"ramjet@owhome=0.8", 0.8, 0},
		{"ramjet@owroom=0", 0, -1},
		{"ramjet@owroom=3", 0, 3},
	} {
		p, err := NewPolicy(tc.name, 1, selection.Config{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		o := p.(*Ramjet).rt.Options()
		if o.OverflowHome != tc.home || o.OverflowHomeRoom != tc.room {
			t.Errorf("%s: OverflowHome %v, OverflowHomeRoom %v, want %v, %v", tc.name, o.OverflowHome, o.OverflowHomeRoom, tc.home, tc.room)
		}
	}
}

// ramjet@owfull=0 turns OverflowFull off, ramjet@owfh=0 and
// ramjet@owfroom=0 its gates (-1: none); unset all are 0, selection's
// defaults.
func TestRamjetNamedOverflowFull(t *testing.T) {
	for _, tc := range []struct {
		name             string
		full, home, room float64
	}{
		{"ramjet", 0, 0, 0},
		{"ramjet@owfull=0", -1, 0, 0},
		{"ramjet@owfull=2", 2, 0, 0},
		{"ramjet@owfh=0+owfroom=0", 0, -1, -1},
		{"ramjet@owfh=0.5+owfroom=3", 0, 0.5, 3},
	} {
		p, err := NewPolicy(tc.name, 1, selection.Config{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		o := p.(*Ramjet).rt.Options()
		if o.OverflowFull != tc.full || o.OverflowFullHome != tc.home || o.OverflowFullRoom != tc.room {
			t.Errorf("%s: OverflowFull %v, OverflowFullHome %v, OverflowFullRoom %v, want %v, %v, %v", tc.name, o.OverflowFull, o.OverflowFullHome, o.OverflowFullRoom, tc.full, tc.home, tc.room)
		}
	}
}

// ramjet@dl=0 fixes the density at chars_per_token; dl alone or with any
// other value is refused rather than read as the default (learned).
func TestRamjetNamedFixedDensity(t *testing.T) {
	p, err := NewPolicy("ramjet@dl=0", 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !p.(*Ramjet).rt.Options().FixedDensity {
		t.Error("ramjet@dl=0: FixedDensity false, want true")
	}
	for _, name := range []string{"ramjet@dl", "ramjet@dl=1"} {
		if _, err := NewPolicy(name, 1, selection.Config{}); err == nil {
			t.Errorf("%s: accepted, want an error", name)
		}
	}
}
