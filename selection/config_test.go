package selection

import (
	"math"
	"strings"
	"testing"
)

// TestConfigZeroKnobs checks every knob whose zero is a value: unset takes
// the default, an explicit zero stays zero (and still validates, and the
// Router keeps it, Retune too), a value that cannot work is rejected
// naming the knob.
func TestConfigZeroKnobs(t *testing.T) {
	tests := []struct {
		name    string
		knob    Knobs
		get     func(Config) float64
		set     func(*Config, float64)
		def     float64
		invalid []float64
	}{
		{"alpha", KnobAlpha, func(c Config) float64 { return c.Alpha }, func(c *Config, v float64) { c.Alpha = v },
			DefaultAlpha, []float64{-1, math.NaN(), math.Inf(1)}},
		{"request_cost", KnobRequestCost, func(c Config) float64 { return float64(c.RequestCost) },
			func(c *Config, v float64) { c.RequestCost = int(v) }, DefaultRequestCost, []float64{-1}},
		{"tie_epsilon", KnobTieEpsilon, func(c Config) float64 { return c.TieEpsilon }, func(c *Config, v float64) { c.TieEpsilon = v },
			DefaultTieEpsilon, []float64{-0.5, math.NaN(), math.Inf(1)}},
		{"output_weight", KnobOutputWeight, func(c Config) float64 { return c.OutputWeight }, func(c *Config, v float64) { c.OutputWeight = v },
			DefaultOutputWeight, []float64{-2, math.NaN(), math.Inf(1)}},
		{"pair_weight", KnobPairWeight, func(c Config) float64 { return c.PairWeight }, func(c *Config, v float64) { c.PairWeight = v },
			DefaultPairWeight, []float64{-1, math.NaN(), math.Inf(1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := KnobNamed(tt.name); got != tt.knob {
				t.Fatalf("KnobNamed(%q) = %v, want %v", tt.name, got, tt.knob)
			}
			var unset Config
			unset.SetDefaults()
			if got := tt.get(unset); got != tt.def {
				t.Errorf("unset: %v, want the default %v", got, tt.def)
			}

			zero := Config{Explicit: tt.knob}
			zero.SetDefaults()
			if got := tt.get(zero); got != 0 {
				t.Errorf("explicit 0: %v, want 0", got)
			}
			if err := zero.Validate(); err != nil {
				t.Errorf("explicit 0: %v", err)
			}
			rt, err := NewRouter(zero)
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.get(rt.Config()); got != 0 {
				t.Errorf("NewRouter: %v, want 0", got)
			}
			rt2, err := rt.Retune(rt.Config())
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.get(rt2.Config()); got != 0 {
				t.Errorf("Retune: %v, want 0", got)
			}
			if rt.Config() == unset {
				t.Errorf("explicit 0 configuration equals the default one")
			}
			// Retune back to unset: the default again.
			rt3, err := rt.Retune(Config{})
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.get(rt3.Config()); got != tt.def {
				t.Errorf("Retune to unset: %v, want %v", got, tt.def)
			}

			for _, v := range tt.invalid {
				c := Config{Explicit: tt.knob}
				tt.set(&c, v)
				c.SetDefaults()
				if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.name) {
					t.Errorf("%s %v: err = %v, want it to name %s", tt.name, v, err, tt.name)
				}
			}
		})
	}
	if KnobNamed("affinity_cap") != 0 || KnobNamed("block_tokens") != 0 {
		t.Errorf("zero is no value of affinity_cap or block_tokens")
	}
}

// TestPureAffinity: with alpha 0 the warm replica wins however loaded it
// is; with the default alpha the load overrides it.
func TestPureAffinity(t *testing.T) {
	for _, tt := range []struct {
		name     string
		cfg      Config
		wantWarm bool
	}{
		{"alpha 0", Config{Explicit: KnobAlpha}, true},
		{"default alpha", Config{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt, err := NewRouter(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			c := rt.Config()
			warm, _ := rt.Register("127.0.0.1:1")
			cold, _ := rt.Register("127.0.0.1:2")
			f := features(c, []uint64{1, 2, 3, 4}, 0)
			rt.Learn(f, warm)
			for range 200 {
				rt.Reserve(warm, 4096)
			}
			d := rt.Pick(f, []Candidate{{Slot: warm, Usable: true}, {Slot: cold, Usable: true}}, NewScratch(2))
			if got := d.Slot == warm; got != tt.wantWarm {
				t.Errorf("picked warm = %v, want %v (decision %+v)", got, tt.wantWarm, d)
			}
		})
	}
}
