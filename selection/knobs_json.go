package selection

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// ExplicitInJSON returns the knobs of ZeroKnobs that the JSON object b
// sets to a value other than null: in a configuration, "alpha": 0 means
// pure affinity while a missing alpha means the default.
func ExplicitInJSON(b []byte) (Knobs, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return 0, err
	}
	var k Knobs
	for name, v := range fields {
		if n := KnobNamed(name); n != 0 && string(v) != "null" {
			k |= n
		}
	}
	return k, nil
}

// AppendExplicitZeros adds to the JSON object b (an encoding of a
// configuration whose zero knobs omitempty dropped) every knob of
// c.Explicit that is zero in c, as "name":0, so that an explicit zero
// survives an encoding.
func (c Config) AppendExplicitZeros(b []byte) []byte {
	zeros := []struct {
		name string
		zero bool
	}{
		{"alpha", c.Alpha == 0}, {"request_cost", c.RequestCost == 0},
		{"tie_epsilon", c.TieEpsilon == 0}, {"output_weight", c.OutputWeight == 0},
		{"pair_weight", c.PairWeight == 0},
	}
	for _, z := range zeros {
		if !z.zero || c.Explicit&KnobNamed(z.name) == 0 {
			continue
		}
		sep := ","
		if bytes.Equal(b, []byte("{}")) {
			sep = ""
		}
		b = append(append(b[:len(b)-1], sep+strconv.Quote(z.name)+":0"...), '}')
	}
	return b
}
