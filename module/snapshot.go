package module

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/snapshot"
)

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
	c := *s.Snapshot
	c.Defaults()
	if err := c.Validate(); err != nil {
		return err
	}
	if err := register(ctx.GetMetricsRegistry(), metrics.Snapshot().Collectors()...); err != nil {
		return fmt.Errorf("snapshot: %w", err)
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
	pk := fleetstate.SettingsKey("ramjet-snapshot", s.poolKey, c)
	rt, fleet, logger := s.rt, s.fleet.StateKey, s.logger.Named("snapshot")
	v, _, err := snapStates.LoadOrNew(pk, func() (caddy.Destructor, error) {
		// The writes outlive this config (a reload keeps them): they stop
		// in Destruct.
		return snapState{snapshot.StartWriter(snapshot.WriterOptions{Router: rt, Fleet: fleet, Path: abs, Key: key,
			Interval: time.Duration(c.Interval), MaxAge: time.Duration(c.MaxAge), MaxBytes: c.MaxBytes, Logger: logger, Metrics: metrics.Snapshot()})}, nil
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
	s.snap.Bind(v.Tracked())
}
