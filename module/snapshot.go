package module

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/snapshot"
)

// DefaultSnapshotKey is where the snapshot key is read by default.
const DefaultSnapshotKey = "{env.RJ_SNAPSHOT_KEY}"

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
	// Required.
	Path string `json:"path,omitempty"`
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

func (c *SnapshotConfig) setDefaults() {
	if c.Interval == 0 {
		c.Interval = caddy.Duration(time.Minute)
	}
	if c.Key == "" {
		c.Key = DefaultSnapshotKey
	}
	if c.MaxAge == 0 {
		c.MaxAge = caddy.Duration(time.Hour)
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = snapshot.DefaultMaxBytes
	}
}

// validate names the bad setting.
func (c *SnapshotConfig) validate() error {
	switch {
	case c.Path == "":
		return errors.New("snapshot path is required")
	case c.Interval < 0:
		return errors.New("snapshot interval must be positive")
	case c.MaxAge < 0:
		return errors.New("snapshot max_age must be positive")
	case c.MaxBytes < 1<<10:
		return fmt.Errorf("snapshot max_bytes must be at least 1KiB, got %d", c.MaxBytes)
	}
	return nil
}

// unmarshalCaddyfile parses the snapshot option of the policy:
//
//	snapshot [<path>] {
//		path      <path>
//		interval  <duration>
//		key       <key>
//		max_age   <duration>
//		max_bytes <size>
//	}
func (c *SnapshotConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		c.Path = d.Val()
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	return subBlock(d, "snapshot", map[string]blockOption{
		"path":      argString(&c.Path),
		"interval":  argPositiveDuration(&c.Interval),
		"key":       argString(&c.Key),
		"max_age":   argPositiveDuration(&c.MaxAge),
		"max_bytes": argSize(&c.MaxBytes),
	})
}

func argPositiveDuration(p *caddy.Duration) blockOption {
	return func(d *caddyfile.Dispenser, opt string) error {
		v, err := oneArg(d, opt)
		if err != nil {
			return err
		}
		*p, err = positiveDuration(d, "snapshot "+opt, v)
		return err
	}
}

// snapStates holds one snapshot writer per fleet and configuration,
// across reloads.
var snapStates = caddy.NewUsagePool()

// snapState writes one fleet's snapshots and applies the one read at
// start.
type snapState struct {
	rt       *selection.Router // any Router of the fleet: they share the index
	path     string
	key      []byte
	shape    snapshot.Shape
	interval time.Duration
	maxBytes int64
	logger   *zap.Logger

	mu sync.Mutex // serialises writes and the import
	// pending is the verified snapshot waiting for the first pool.
	pending atomic.Pointer[snapshot.Snapshot]
	// seen: a policy has seen its pool (and pending was applied). Until
	// then nothing is written: a config that never routed (caddy
	// validate, a start without traffic) must not replace the snapshot
	// with an empty index.
	seen atomic.Bool

	stop, done chan struct{}
}

// Destruct stops the periodic writes and writes the last snapshot: the
// last policy using the fleet was cleaned up.
func (g *snapState) Destruct() error {
	close(g.stop)
	<-g.done
	return g.write("shutdown")
}

func (g *snapState) run() {
	defer close(g.done)
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			_ = g.write("interval") // logged and counted in write
		}
	}
}

// write writes the fleet's index now, once a policy has seen its pool.
func (g *snapState) write(why string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.seen.Load() {
		return nil
	}
	m := snapMetrics()
	start := time.Now()
	// The bound leaves room for the header and every replica's entry.
	maxBlocks := int((g.maxBytes - 64 - int64(selection.MaxReplicas)*(snapshot.IDBytes+4)) / 8)
	s := &snapshot.Snapshot{Shape: g.shape, Written: start,
		Replicas: snapshot.FromBeliefs(g.key, g.rt.ExportIndex(max(1, maxBlocks)))}
	n, err := snapshot.Write(g.path, g.key, s)
	if err != nil {
		m.writes.WithLabelValues("error").Inc()
		g.logger.Warn("ramjet snapshot not written", zap.String("trigger", why), zap.Error(err))
		return err
	}
	m.writes.WithLabelValues("ok").Inc()
	m.lastWrite.Set(float64(start.UnixNano()) / 1e9)
	m.bytes.Set(float64(n))
	if c := g.logger.Check(zap.DebugLevel, "ramjet snapshot written"); c != nil || why == "shutdown" {
		fields := []zap.Field{zap.String("trigger", why), zap.Int("replicas", len(s.Replicas)),
			zap.Int("blocks", s.Blocks()), zap.Int("bytes", n), zap.Duration("took", time.Since(start))}
		if c != nil {
			c.Write(fields...)
		} else {
			g.logger.Info("ramjet snapshot written", fields...)
		}
	}
	return nil
}

// refuse reports a snapshot that is not loaded: ramjet starts cold.
func (g *snapState) refuse(reason snapshot.Reason, err error) {
	snapMetrics().loads.WithLabelValues(string(reason)).Inc()
	lvl := zap.WarnLevel
	if reason == snapshot.Missing {
		lvl = zap.InfoLevel // the first start, or a fresh volume
	}
	if c := g.logger.Check(lvl, "ramjet snapshot refused, starting cold"); c != nil {
		c.Write(zap.String("reason", string(reason)), zap.String("path", g.path), zap.Error(err))
	}
}

// load reads the snapshot at start; a verified one waits for the pool.
func (g *snapState) load(maxAge time.Duration) {
	if g.rt.Index().Pairs() > 0 {
		// The fleet outlived a config change: what it holds is newer.
		g.logger.Info("ramjet snapshot not read: the fleet already holds an index", zap.String("path", g.path))
		return
	}
	s, err := snapshot.Read(g.path, snapshot.ReadOptions{Key: g.key, Shape: g.shape, MaxAge: maxAge, MaxBytes: g.maxBytes})
	if err != nil {
		var e *snapshot.Error
		if !errors.As(err, &e) {
			e = &snapshot.Error{Reason: snapshot.Unreadable, Err: err}
		}
		g.refuse(e.Reason, e.Err)
		return
	}
	g.pending.Store(s)
}

// bind applies the pending snapshot to the replicas of pool (replica keys,
// "" for an untracked upstream) the first time the policy sees one.
func (g *snapState) bind(pool []string) {
	if g.seen.Load() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	defer g.seen.Store(true)
	s := g.pending.Swap(nil)
	if s == nil {
		return
	}
	bs, dropped := s.Beliefs(g.key, pool)
	m := snapMetrics()
	m.dropped.Add(float64(dropped))
	if len(bs) == 0 {
		g.refuse(snapshot.ShapeMismatch, fmt.Errorf("none of the snapshot's %d replicas is in the pool of %d (another replica set, or another key)",
			len(s.Replicas), len(pool)))
		return
	}
	reps, blocks := g.rt.ImportIndex(bs)
	m.loads.WithLabelValues("loaded").Inc()
	m.loaded.Set(float64(blocks))
	g.logger.Info("ramjet snapshot loaded", zap.String("path", g.path), zap.Int("replicas", reps),
		zap.Int("blocks", blocks), zap.Int("dropped_replicas", dropped), zap.Duration("age", time.Since(s.Written)))
}

func (s *RamjetSelection) provisionSnapshot(ctx caddy.Context) error {
	c := s.Snapshot
	if c == nil {
		return nil
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return err
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := metrics.Register(reg, snapMetrics().collectors()...); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	key := []byte(resolveSecret(c.Key))
	if len(key) < snapshot.MinKeyBytes {
		// Fail closed, and never stop serving for it: no snapshot is
		// trusted or written without the key.
		snapMetrics().loads.WithLabelValues(noKey).Inc()
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
	rt, logger := s.rt, s.logger.Named("snapshot")
	v, _, err := snapStates.LoadOrNew(pk, func() (caddy.Destructor, error) {
		g := &snapState{rt: rt, path: abs, key: key, shape: snapshot.ShapeOf(rt.Config()),
			interval: time.Duration(c.Interval), maxBytes: c.MaxBytes, logger: logger,
			stop: make(chan struct{}), done: make(chan struct{})}
		g.load(time.Duration(c.MaxAge))
		// The writes outlive this config (a reload keeps them): they stop
		// in Destruct.
		go g.run()
		return g, nil
	})
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	s.snap, s.snapKey = v.(*snapState), pk
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
	s.snap.bind(keys)
}

// snapCollector holds the snapshot metrics, created once and registered
// into every config's registry.
type snapCollector struct {
	loads     *prometheus.CounterVec
	writes    *prometheus.CounterVec
	dropped   prometheus.Counter
	loaded    prometheus.Gauge
	lastWrite prometheus.Gauge
	bytes     prometheus.Gauge
}

// noKey is the load outcome of a policy whose snapshot key is missing.
const noKey = "no_key"

var snapMetrics = sync.OnceValue(func() *snapCollector {
	m := &snapCollector{
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ramjet_snapshot_loads_total",
			Help: "Index snapshots read at start, by outcome: loaded, or why ramjet started cold (missing, tampered, shape_mismatch, too_old, too_large, unreadable, no_key)."},
			[]string{"outcome"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ramjet_snapshot_writes_total",
			Help: "Index snapshots written, by outcome (ok, error)."}, []string{"outcome"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "ramjet_snapshot_dropped_replicas_total",
			Help: "Replicas of a loaded snapshot left out because they are not in the upstream pool."}),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ramjet_snapshot_loaded_blocks",
			Help: "(block, replica) beliefs the last loaded snapshot restored."}),
		lastWrite: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ramjet_snapshot_last_write_timestamp_seconds",
			Help: "When the last snapshot was written, in seconds since the epoch."}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ramjet_snapshot_bytes",
			Help: "Size of the last snapshot written, in bytes."}),
	}
	m.loads.WithLabelValues("loaded")
	m.loads.WithLabelValues(noKey)
	for _, r := range snapshot.Reasons {
		m.loads.WithLabelValues(string(r))
	}
	m.writes.WithLabelValues("ok")
	m.writes.WithLabelValues("error")
	return m
})

func (m *snapCollector) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.loads, m.writes, m.dropped, m.loaded, m.lastWrite, m.bytes}
}

// snapshotDirectiveOptions are the ramjet directive's snapshot options
// (deploy/Caddyfile drives them from RJ_* settings); snapshots are on when
// snapshot_path is given. A value left empty keeps the default.
var snapshotDirectiveOptions = map[string]bool{
	"snapshot_path": true, "snapshot_interval": true, "snapshot_max_age": true, "snapshot_key": true,
}

// snapshotDirective collects the ramjet directive's snapshot options.
type snapshotDirective struct {
	c SnapshotConfig
}

func (k *snapshotDirective) parse(d *caddyfile.Dispenser, name string, args []string) error {
	switch len(args) {
	case 0:
		return nil
	case 1:
	default:
		return d.Errf("%s: want one value", name)
	}
	v := args[0]
	var err error
	switch name {
	case "snapshot_path":
		k.c.Path = v
	case "snapshot_key":
		k.c.Key = v
	case "snapshot_interval":
		k.c.Interval, err = positiveDuration(d, name, v)
	case "snapshot_max_age":
		k.c.MaxAge, err = positiveDuration(d, name, v)
	}
	return err
}

// config is the policy's snapshot configuration, nil when off.
func (k *snapshotDirective) config() *SnapshotConfig {
	if k.c.Path == "" {
		return nil
	}
	c := k.c
	return &c
}
