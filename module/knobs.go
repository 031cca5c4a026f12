package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/dustin/go-humanize"

	"github.com/ramjet-llm/ramjet/selection"
)

// routingKnobs is the one table of the routing knobs (selection.Config),
// by their Caddyfile and JSON name: lb_policy ramjet and the ramjet
// directive both read them through setKnob.
var routingKnobs = map[string]func(c *selection.Config, v string) error{
	"affinity_cap":       func(c *selection.Config, v string) (err error) { c.AffinityCap, err = parseInt(v); return },
	"alpha":              func(c *selection.Config, v string) (err error) { c.Alpha, err = parseFloat(v); return },
	"request_cost":       func(c *selection.Config, v string) (err error) { c.RequestCost, err = parseInt(v); return },
	"block_tokens":       func(c *selection.Config, v string) (err error) { c.BlockTokens, err = parseInt(v); return },
	"prefix_tokens":      func(c *selection.Config, v string) (err error) { c.PrefixTokens, err = parseInt(v); return },
	"chars_per_token":    func(c *selection.Config, v string) (err error) { c.CharsPerToken, err = parseFloat(v); return },
	"index_budget":       func(c *selection.Config, v string) (err error) { c.IndexBudget, err = parseSize(v); return },
	"long_output_tokens": func(c *selection.Config, v string) (err error) { c.LongOutputTokens, err = parseInt(v); return },
	"tie_epsilon":        func(c *selection.Config, v string) (err error) { c.TieEpsilon, err = parseFloat(v); return },
	"output_weight":      func(c *selection.Config, v string) (err error) { c.OutputWeight, err = parseFloat(v); return },
	"context_weight":     func(c *selection.Config, v string) (err error) { c.ContextWeight, err = parseFloat(v); return },
	"pair_weight":        func(c *selection.Config, v string) (err error) { c.PairWeight, err = parseFloat(v); return },
	"kv_capacity": func(c *selection.Config, v string) (err error) {
		n, err := parseInt(v)
		c.KVCapacity = int64(n)
		return err
	},
}

// setKnob parses v into knob name of c. A knob given is explicit: its
// zero is kept (alpha 0 is pure affinity), where zero is a value of it.
func setKnob(c *selection.Config, name, v string) error {
	set, ok := routingKnobs[name]
	if !ok {
		return fmt.Errorf("unknown routing knob %q", name)
	}
	if err := set(c, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	c.Explicit |= selection.KnobNamed(name)
	return nil
}

func parseInt(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not an integer", v)
	}
	return n, nil
}

func parseFloat(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a number", v)
	}
	return f, nil
}

// parseSize reads a size with an optional unit (64MiB, 512KB).
func parseSize(v string) (int64, error) {
	n, err := humanize.ParseBytes(v)
	if err != nil || n > 1<<50 {
		return 0, fmt.Errorf("%q is not a size", v)
	}
	return int64(n), nil
}

// UnmarshalJSON decodes the policy as Caddy does (unknown fields are an
// error) and marks the routing knobs present in the JSON as explicit, so
// that "alpha": 0 means pure affinity while a missing alpha means the
// default.
func (s *RamjetSelection) UnmarshalJSON(b []byte) error {
	type plain RamjetSelection // without these methods
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode((*plain)(s)); err != nil {
		return err
	}
	k, err := selection.ExplicitInJSON(b)
	s.Explicit |= k
	return err
}

// MarshalJSON encodes the policy, writing the explicit zero knobs that
// omitempty would drop, so that a Caddyfile's alpha 0 survives the
// Caddyfile -> JSON adaptation.
func (s *RamjetSelection) MarshalJSON() ([]byte, error) {
	type plain RamjetSelection
	b, err := json.Marshal((*plain)(s))
	if err != nil {
		return nil, err
	}
	return s.Config.AppendExplicitZeros(b), nil
}
