package snapshot

import (
	"errors"
	"fmt"
	"time"
)

// DefaultKey is where the snapshot key is read by default (a Caddy
// placeholder the module resolves).
const DefaultKey = "{env.RJ_SNAPSHOT_KEY}"

// Settings are one fleet's snapshot configuration as the Caddy module's
// snapshot option gives it (typed durations). Defaults fills the zero
// fields; Validate names the bad setting.
type Settings struct {
	// Path is the snapshot file. Required.
	Path string
	// Interval is the time between two periodic writes. Default 1m.
	Interval time.Duration
	// Key is the key as configured (a placeholder or the key itself).
	// Default DefaultKey.
	Key string
	// MaxAge refuses older snapshots. Default 1h.
	MaxAge time.Duration
	// MaxBytes bounds the snapshot file read and written. Default
	// DefaultMaxBytes.
	MaxBytes int64
}

// Defaults fills the zero fields with the defaults.
func (s *Settings) Defaults() {
	if s.Interval == 0 {
		s.Interval = time.Minute
	}
	if s.Key == "" {
		s.Key = DefaultKey
	}
	if s.MaxAge == 0 {
		s.MaxAge = time.Hour
	}
	if s.MaxBytes == 0 {
		s.MaxBytes = DefaultMaxBytes
	}
}

// Validate names the bad setting (the module's option names). It expects
// Defaults to have run.
func (s *Settings) Validate() error {
	switch {
	case s.Path == "":
		return errors.New("snapshot path is required")
	case s.Interval < 0:
		return errors.New("snapshot interval must be positive")
	case s.MaxAge < 0:
		return errors.New("snapshot max_age must be positive")
	case s.MaxBytes < 1<<10:
		return fmt.Errorf("snapshot max_bytes must be at least 1KiB, got %d", s.MaxBytes)
	}
	return nil
}
