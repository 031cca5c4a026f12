package snapshot

import (
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
)

func TestSettingsDefaultsValidate(t *testing.T) {
	var d Settings
	d.Path = "/s"
	d.Defaults()
	if want := (Settings{Path: "/s", Interval: duration.Duration(time.Minute), Key: DefaultKey, MaxAge: duration.Duration(time.Hour), MaxBytes: DefaultMaxBytes}); d != want {
		t.Fatalf("defaults %+v, want %+v", d, want)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	tests := []struct {
		name    string
		give    Settings
		wantErr string
	}{
		{"no path", Settings{}, "snapshot path is required"},
		{"interval", Settings{Path: "/s", Interval: duration.Duration(-time.Second)}, "snapshot interval must be positive"},
		{"max_age", Settings{Path: "/s", MaxAge: duration.Duration(-time.Second)}, "snapshot max_age must be positive"},
		{"max_bytes", Settings{Path: "/s", MaxBytes: 10}, "max_bytes must be at least 1KiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.give
			s.Defaults()
			if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%+v: error %v, want %q", tt.give, err, tt.wantErr)
			}
		})
	}
}
