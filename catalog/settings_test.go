package catalog

import (
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/edge"
)

func TestSettings(t *testing.T) {
	var s Settings
	s.SetDefaults()
	if s != (Settings{Timeout: duration.Duration(edge.DefaultModelsTimeout), Cache: duration.Duration(DefaultCache)}) {
		t.Fatalf("defaults %+v", s)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	given := Settings{Timeout: duration.Duration(time.Second), Cache: duration.Duration(time.Minute)}
	kept := given
	kept.SetDefaults()
	if kept != given {
		t.Errorf("SetDefaults replaced given values: %+v", kept)
	}
	for _, tt := range []struct {
		give    Settings
		wantErr string
	}{
		{Settings{Timeout: -1}, "timeout must be positive"},
		{Settings{Cache: -1}, "cache must be >= 0"},
	} {
		if err := tt.give.Validate(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%+v: error %v, want %q", tt.give, err, tt.wantErr)
		}
	}
}

func TestCovers(t *testing.T) {
	tests := []struct {
		name      string
		upstreams []string
		dials     []string
		want      bool
	}{
		{"same", []string{"a:1", "b:1"}, []string{"b:1", "a:1"}, true},
		{"ranks listed twice", []string{"a:1", "b:1"}, []string{"a:1", "a:1", "b:1"}, true},
		{"scheme in the upstream", []string{"https://a:1"}, []string{"a:1"}, true},
		{"one missing", []string{"a:1", "b:1"}, []string{"a:1"}, false},
		{"another engine", []string{"a:1"}, []string{"a:1", "c:1"}, false},
		{"empty proxy", []string{"a:1"}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Covers(tt.upstreams, tt.dials); got != tt.want {
				t.Errorf("Covers(%q, %q) = %v, want %v", tt.upstreams, tt.dials, got, tt.want)
			}
		})
	}
}
