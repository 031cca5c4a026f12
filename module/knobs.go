package module

import (
	"bytes"
	"encoding/json"

	"github.com/ramjet-llm/ramjet/selection"
)

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
