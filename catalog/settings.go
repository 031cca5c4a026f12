package catalog

import (
	"fmt"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/edge"
)

// DefaultCache is how long a merged model list is served before the
// engines are asked again.
const DefaultCache = 5 * time.Second

// Settings are the ramjet_models handler's own settings (the JSON of
// module.Models besides the engines it shares with ramjet_guard).
// SetDefaults fills the zero fields; Validate names the bad setting.
type Settings struct {
	// Timeout bounds one fetch of all engines' lists. Default 2s.
	Timeout duration.Duration `json:"timeout,omitempty"`

	// Cache is how long a merged list is served before the engines are
	// asked again. Default 5s.
	Cache duration.Duration `json:"cache,omitempty"`
}

// SetDefaults fills the zero fields with the defaults.
func (s *Settings) SetDefaults() {
	if s.Timeout == 0 {
		s.Timeout = duration.Duration(edge.DefaultModelsTimeout)
	}
	if s.Cache == 0 {
		s.Cache = duration.Duration(DefaultCache)
	}
}

// Validate rejects bad values, naming the field.
func (s *Settings) Validate() error {
	switch {
	case s.Timeout < 0:
		return fmt.Errorf("timeout must be positive, got %v", s.Timeout)
	case s.Cache < 0:
		return fmt.Errorf("cache must be >= 0, got %v", s.Cache)
	}
	return nil
}

// Covers reports whether dials (a reverse_proxy's upstream list, a
// data-parallel engine listed once per rank) names exactly the engines of
// upstreams: each of them, and no other.
func Covers(upstreams, dials []string) bool {
	want := make(map[string]bool, len(upstreams))
	for _, u := range upstreams {
		want[DialOf(u)] = true
	}
	seen := make(map[string]bool, len(want))
	for _, d := range dials {
		if !want[d] {
			return false
		}
		seen[d] = true
	}
	return len(seen) == len(want)
}
