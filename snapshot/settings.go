package snapshot

import (
	"errors"
	"fmt"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
)

// DefaultKey is where the snapshot key is read by default (a Caddy
// placeholder the module resolves).
const DefaultKey = "{env.RJ_SNAPSHOT_KEY}"

// Settings turn on authenticated snapshots of the approximate index (the
// ramjet policy's "snapshot", module.RamjetSelection.Snapshot), off by
// default. Every Interval, and when the last policy using the fleet is
// cleaned up (a clean shutdown; not a reload that keeps these settings,
// which keeps the index in memory), ramjet writes what it believes each
// replica holds (block hashes, per replica a keyed hash of its replica key:
// no text, no address) to Path, and beside it Path + ".hmac", an
// HMAC-SHA256 over the snapshot under Key. On start the snapshot is loaded
// only when the companion verifies, the index shape is the same (format
// version, block_tokens, prefix_tokens, chars_per_token, the fingerprint's
// hash scheme) and it is younger than MaxAge; it is applied when the policy
// first sees its upstream pool, and the replicas of the snapshot that are
// not in that pool are dropped. Otherwise ramjet starts cold, with a
// warning naming the reason and ramjet_snapshot_loads_total{outcome}.
// Defaults fills the zero fields; Validate names the bad setting.
type Settings struct {
	// Path is the snapshot file, on a volume that survives restarts.
	// Required. In the Caddyfile: snapshot [<path>] { ... }.
	Path string `json:"path,omitempty" caddyfile:"arg"`
	// Interval is the time between two periodic writes. Default 1m.
	Interval duration.Duration `json:"interval,omitempty"`
	// Key authenticates the snapshot (HMAC-SHA256) and keys the replica
	// ids in it, at least 16 bytes; give it as a placeholder so that it
	// never appears in the config. It is its own secret, not the route-id
	// secret: route ids are sent to every client and their secret is
	// optional (random per process by default), while this key vouches
	// for a file ramjet trusts at start. Default
	// "{env.RJ_SNAPSHOT_KEY}".
	Key string `json:"key,omitempty"`
	// MaxAge refuses older snapshots (the engines' caches have likely
	// moved on). Default 1h.
	MaxAge duration.Duration `json:"max_age,omitempty"`
	// MaxBytes bounds the snapshot file read at start and written (past
	// it, each replica's least recently routed blocks are left out).
	// Default 64MiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`
}

// Defaults fills the zero fields with the defaults.
func (s *Settings) Defaults() {
	if s.Interval == 0 {
		s.Interval = duration.Duration(time.Minute)
	}
	if s.Key == "" {
		s.Key = DefaultKey
	}
	if s.MaxAge == 0 {
		s.MaxAge = duration.Duration(time.Hour)
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
