package module

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestKnobsZeroIsAValue runs every knob whose zero is a value through the
// whole configuration path (Caddyfile -> JSON -> Provision): unset takes
// the default, an explicit 0 stays 0, a value that cannot work is refused
// naming the knob.
func TestKnobsZeroIsAValue(t *testing.T) {
	tests := []struct {
		name    string
		get     func(selection.Config) float64
		def     float64
		invalid string
	}{
		{"alpha", func(c selection.Config) float64 { return c.Alpha }, selection.DefaultAlpha, "-1"},
		{"request_cost", func(c selection.Config) float64 { return float64(c.RequestCost) }, selection.DefaultRequestCost, "-5"},
		{"tie_epsilon", func(c selection.Config) float64 { return c.TieEpsilon }, selection.DefaultTieEpsilon, "-0.5"},
		{"output_weight", func(c selection.Config) float64 { return c.OutputWeight }, selection.DefaultOutputWeight, "-2"},
		{"pair_weight", func(c selection.Config) float64 { return c.PairWeight }, selection.DefaultPairWeight, "-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range []struct {
				name, block string
				want        float64
				wantErr     bool
			}{
				{"unset", "", tt.def, false},
				{"zero", tt.name + " 0", 0, false},
				{"one", tt.name + " 1", 1, false},
				{"invalid", tt.name + " " + tt.invalid, 0, true},
			} {
				t.Run(c.name, func(t *testing.T) {
					cfg, err := provisionPolicy(t, "ramjet {\n state_key knobs_"+tt.name+"_"+c.name+"\n "+c.block+"\n}")
					if c.wantErr {
						if err == nil || !strings.Contains(err.Error(), tt.name) {
							t.Fatalf("err = %v, want it to name %s", err, tt.name)
						}
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if got := tt.get(cfg); got != c.want {
						t.Errorf("%s = %v, want %v", tt.name, got, c.want)
					}
				})
			}
		})
	}
}

// provisionPolicy parses a lb_policy ramjet block, adapts it to JSON,
// decodes it as Caddy does and provisions it: the routing configuration
// the fleet's Router runs with.
func provisionPolicy(t *testing.T, block string) (selection.Config, error) {
	t.Helper()
	q, err := provisionKeep(t, block)
	if err != nil {
		return selection.Config{}, err
	}
	defer q.Cleanup()
	return q.rt.Config(), nil
}

// provisionKeep is provisionPolicy returning the provisioned policy (the
// caller cleans it up; its context ends with the test).
func provisionKeep(t *testing.T, block string) (*RamjetSelection, error) {
	t.Helper()
	var p RamjetSelection
	if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(block)); err != nil {
		return nil, err
	}
	b, err := json.Marshal(&p)
	if err != nil {
		t.Fatal(err)
	}
	var q RamjetSelection
	if err := caddy.StrictUnmarshalJSON(b, &q); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := q.Provision(ctx); err != nil {
		return nil, err
	}
	return &q, nil
}

func TestPolicyJSONKnobs(t *testing.T) {
	tests := []struct {
		give    string
		want    selection.Knobs
		wantErr string
	}{
		{give: `{}`},
		{give: `{"alpha":0}`, want: selection.KnobAlpha},
		{give: `{"alpha":null,"affinity_cap":0}`},
		{give: `{"request_cost":0,"tie_epsilon":0,"output_weight":0,"pair_weight":0,"alpha":2}`, want: selection.ZeroKnobs},
		{give: `{"alpah":0}`, wantErr: "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			var p RamjetSelection
			err := caddy.StrictUnmarshalJSON([]byte(tt.give), &p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Explicit != tt.want {
				t.Errorf("explicit = %b, want %b", p.Explicit, tt.want)
			}
			// Round trip: the explicit zeros are written out again.
			b, err := json.Marshal(&p)
			if err != nil {
				t.Fatal(err)
			}
			var q RamjetSelection
			if err := caddy.StrictUnmarshalJSON(b, &q); err != nil {
				t.Fatal(err)
			}
			if q.Explicit != tt.want || q.Config != p.Config {
				t.Errorf("round trip %s: %+v, want %+v", b, q.Config, p.Config)
			}
		})
	}
}
