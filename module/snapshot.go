package module

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/cespare/xxhash/v2"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/snapshot"
)

// DefaultSnapshotKey is where the snapshot key is read by default.
const DefaultSnapshotKey = snapshot.DefaultKey

// SnapshotConfig turns on authenticated snapshots of the approximate
// index, off by default. Every Interval, and when the last policy using
// the fleet is cleaned up (a clean shutdown; not a reload that keeps these
// settings, which keeps the index in memory), ramjet writes what it believes each replica holds
// (block hashes, per replica a keyed hash of its replica key: no text, no
// address) to Path, and beside it Path + ".hmac", an HMAC-SHA256 over the
// snapshot under Key. On start the snapshot is loaded only when the
// companion verifies, the index shape is the same (format version,
// block_tokens, prefix_tokens, chars_per_token, the fingerprint's hash
// scheme) and it is younger than MaxAge; it is applied when the policy
// first sees its upstream pool, and the replicas of the snapshot that are
// not in that pool are dropped. Otherwise ramjet starts cold, with a
// warning naming the reason and ramjet_snapshot_loads_total{outcome}.
type SnapshotConfig struct {
	// Path is the snapshot file, on a volume that survives restarts.
	// Required. In the Caddyfile: snapshot [<path>] { ... }.
	Path string `json:"path,omitempty" caddyfile:"arg"`
	// Interval is the time between two periodic writes. Default 1m.
	Interval caddy.Duration `json:"interval,omitempty"`
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
	MaxAge caddy.Duration `json:"max_age,omitempty"`
	// MaxBytes bounds the snapshot file read at start and written (past
	// it, each replica's least recently routed blocks are left out).
	// Default 64MiB.
	MaxBytes int64 `json:"max_bytes,omitempty"`
}

// settings are c typed, defaults filled (snapshot.Settings).
func (c *SnapshotConfig) settings() snapshot.Settings {
	st := snapshot.Settings{Path: c.Path, Interval: time.Duration(c.Interval), Key: c.Key,
		MaxAge: time.Duration(c.MaxAge), MaxBytes: c.MaxBytes}
	st.Defaults()
	return st
}

// snapStates holds one snapshot writer per fleet and configuration,
// across reloads.
var snapStates = caddy.NewUsagePool()

// snapState is a fleet's snapshot.Writer in snapStates.
type snapState struct{ *snapshot.Writer }

// Destruct stops the periodic writes and writes the last snapshot: the
// last policy using the fleet was cleaned up.
func (g snapState) Destruct() error { return g.Close() }

func (s *RamjetSelection) provisionSnapshot(ctx caddy.Context) error {
	if s.Snapshot == nil {
		return nil
	}
	c := s.Snapshot.settings()
	if err := c.Validate(); err != nil {
		return err
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := metrics.Register(reg, metrics.Snapshot().Collectors()...); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	key := []byte(resolveSecret(c.Key))
	if len(key) < snapshot.MinKeyBytes {
		// Fail closed, and never stop serving for it: no snapshot is
		// trusted or written without the key.
		metrics.Snapshot().NoKey(s.fleet.StateKey)
		s.logger.Named("snapshot").Error("ramjet snapshots off: the snapshot key is unset or too short, starting cold",
			zap.String("key", c.Key), zap.Int("min_bytes", snapshot.MinKeyBytes))
		return nil
	}
	abs, err := filepath.Abs(c.Path)
	if err != nil {
		return fmt.Errorf("snapshot path: %w", err)
	}
	b, _ := json.Marshal(c)
	pk := fmt.Sprintf("ramjet-snapshot/%s/%016x", s.poolKey, xxhash.Sum64(b))
	rt, fleet, logger := s.rt, s.fleet.StateKey, s.logger.Named("snapshot")
	v, _, err := snapStates.LoadOrNew(pk, func() (caddy.Destructor, error) {
		// The writes outlive this config (a reload keeps them): they stop
		// in Destruct.
		return snapState{snapshot.StartWriter(snapshot.WriterOptions{Router: rt, Fleet: fleet, Path: abs, Key: key,
			Interval: c.Interval, MaxAge: c.MaxAge, MaxBytes: c.MaxBytes, Logger: logger, Metrics: metrics.Snapshot()})}, nil
	})
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	s.snap, s.snapKey = v.(snapState).Writer, pk
	return nil
}

func (s *RamjetSelection) cleanupSnapshot() error {
	if s.snap == nil {
		return nil
	}
	s.snap = nil
	_, err := snapStates.Delete(s.snapKey)
	return err
}

// bindSnapshot applies a snapshot read at start to a new pool view.
func (s *RamjetSelection) bindSnapshot(v *poolView) {
	if s.snap == nil {
		return
	}
	keys := make([]string, 0, len(v.keys))
	for i, k := range v.keys {
		if v.slots[i] >= 0 {
			keys = append(keys, k)
		}
	}
	s.snap.Bind(keys)
}
