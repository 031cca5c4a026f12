package module

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestReadmeKnobDefaults holds module/README.md's knob table to the
// defaults the routing rule uses (the table said request_cost 2048 long
// after the default became 512).
func TestReadmeKnobDefaults(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for knob, want := range map[string]float64{
		"affinity_cap":       selection.DefaultAffinityCap,
		"alpha":              selection.DefaultAlpha,
		"request_cost":       selection.DefaultRequestCost,
		"block_tokens":       selection.DefaultBlockTokens,
		"prefix_tokens":      selection.DefaultPrefixTokens,
		"chars_per_token":    selection.DefaultCharsPerToken,
		"long_output_tokens": selection.DefaultLongOutputTokens,
		"tie_epsilon":        selection.DefaultTieEpsilon,
		"output_weight":      selection.DefaultOutputWeight,
		"pair_weight":        selection.DefaultPairWeight,
		"context_weight":     selection.DefaultContextWeight,
	} {
		m := regexp.MustCompile("(?m)^\\| `" + knob + "` \\| ([0-9.]+) \\|").FindSubmatch(b)
		if m == nil {
			t.Errorf("README.md: no knob table row for %s with a numeric default", knob)
			continue
		}
		got, err := strconv.ParseFloat(string(m[1]), 64)
		if err != nil || got != want {
			t.Errorf("README.md: %s default %q, the rule's is %v", knob, m[1], want)
		}
	}
}
