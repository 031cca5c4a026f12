package workload

import (
	"bytes"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSynthCacheMatchesSynth replays every workload and a Mooncake-format
// trace through a SynthCache, with a budget large enough to keep all and
// with one that runs out part way, and checks each prompt and completion
// against Synth's.
func TestSynthCacheMatchesSynth(t *testing.T) {
	rows, err := GenerateMooncake("conversation", MooncakeGenOptions{Seed: 1, Sessions: 30})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteMooncake(&buf, rows); err != nil {
		t.Fatal(err)
	}
	mc, err := ReadMooncake(&buf, MooncakeOptions{BlockTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	traces := map[string]Trace{"mooncake": mc}
	for _, name := range Names {
		w, err := Generate(name, Options{Seed: 2, Scale: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		traces[name] = w.Trace
	}
	s := Synth{Salt: 7}
	for name, tr := range traces {
		for _, budget := range []int{1 << 30, 20000} {
			c := NewSynthCache(s, budget)
			for _, r := range tr {
				if want, got := s.Prompt(nil, r), c.Prompt(nil, r); !slices.Equal(want, got) {
					t.Fatalf("%s budget %d row %d: prompt (-synth +cache):\n%s", name, budget, r.ID, cmp.Diff(want, got))
				}
				if want, got := s.Completion(nil, r), c.Completion(nil, r); !slices.Equal(want, got) {
					t.Fatalf("%s budget %d row %d: completion (-synth +cache):\n%s", name, budget, r.ID, cmp.Diff(want, got))
				}
			}
			if c.used > budget {
				t.Fatalf("%s: kept %d tokens, budget %d", name, c.used, budget)
			}
		}
	}
}
