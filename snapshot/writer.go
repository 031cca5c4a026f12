package snapshot

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/selection"
)

// NoKey is the load outcome of a policy whose snapshot key is missing or
// too short: snapshots are off (not a Reason Read gives).
const NoKey Reason = "no_key"

// Loaded is the load outcome of a snapshot that was applied.
const Loaded = "loaded"

// WriterOptions configure a Writer.
type WriterOptions struct {
	// Router is any Router of the fleet: they share the index.
	Router *selection.Router
	// Fleet names the fleet in the metrics and logs (its state key).
	Fleet string
	// Path is the snapshot file (absolute), Key its key (at least
	// MinKeyBytes).
	Path string
	Key  []byte
	// Interval is the time between two periodic writes, MaxAge the age
	// past which the snapshot read at start is refused, MaxBytes the
	// bound on the file read and written.
	Interval time.Duration
	MaxAge   time.Duration
	MaxBytes int64
	Logger   *zap.Logger
	Metrics  *Metrics
}

// Writer writes one fleet's snapshots and applies the one read at start.
type Writer struct {
	rt       *selection.Router
	path     string
	key      []byte
	shape    Shape
	interval time.Duration
	maxBytes int64
	logger   *zap.Logger
	m        fleetMetrics

	mu sync.Mutex // serialises writes and the import (held by the import goroutine)
	// imports is the import goroutine Bind starts, for Close to wait on.
	imports sync.WaitGroup
	// pending is the verified snapshot waiting for the first pool.
	pending atomic.Pointer[Snapshot]
	// seen: a policy has seen its pool (and pending was applied). Until
	// then nothing is written: a config that never routed (caddy
	// validate, a start without traffic) must not replace the snapshot
	// with an empty index.
	seen atomic.Bool

	stop, done chan struct{}
}

// StartWriter reads the snapshot at o.Path (a verified one waits for
// Bind) and starts the periodic writes, which run until Close.
func StartWriter(o WriterOptions) *Writer {
	g := &Writer{rt: o.Router, path: o.Path, key: o.Key, shape: ShapeOf(o.Router.Config()),
		interval: o.Interval, maxBytes: o.MaxBytes, logger: o.Logger.With(zap.String("fleet", o.Fleet)), m: o.Metrics.fleet(o.Fleet),
		stop: make(chan struct{}), done: make(chan struct{})}
	g.load(o.MaxAge)
	go g.run()
	return g
}

// Close stops the periodic writes and writes the last snapshot: the last
// policy using the fleet was cleaned up.
func (g *Writer) Close() error {
	close(g.stop)
	<-g.done
	err := g.write("shutdown") // after the import: it holds mu
	g.imports.Wait()
	return err
}

func (g *Writer) run() {
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
func (g *Writer) write(why string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.seen.Load() {
		return nil
	}
	m := g.m
	start := time.Now()
	// The bound leaves room for the header and every replica's entry.
	maxBlocks := int((g.maxBytes - 64 - int64(selection.MaxReplicas)*(IDBytes+4)) / 8)
	s := &Snapshot{Shape: g.shape, Written: start,
		Replicas: FromBeliefs(g.key, g.rt.ExportIndex(max(1, maxBlocks)))}
	n, err := Write(g.path, g.key, s)
	if err != nil {
		m.writes.WithLabelValues("error").Inc()
		g.logger.Warn("ramjet snapshot not written", zap.String("trigger", why), zap.Error(err))
		return err
	}
	m.writes.WithLabelValues("ok").Inc()
	m.lastWrite.Set(float64(start.UnixNano()) / 1e9)
	m.bytesNow.Set(float64(n))
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
func (g *Writer) refuse(reason Reason, err error) {
	g.m.loads.WithLabelValues(string(reason)).Inc()
	lvl := zap.WarnLevel
	if reason == Missing {
		lvl = zap.InfoLevel // the first start, or a fresh volume
	}
	if c := g.logger.Check(lvl, "ramjet snapshot refused, starting cold"); c != nil {
		c.Write(zap.String("reason", string(reason)), zap.String("path", g.path), zap.Error(err))
	}
}

// load reads the snapshot at start; a verified one waits for the pool.
func (g *Writer) load(maxAge time.Duration) {
	if g.rt.Index().Pairs() > 0 {
		// The fleet outlived a config change: what it holds is newer.
		g.logger.Info("ramjet snapshot not read: the fleet already holds an index", zap.String("path", g.path))
		return
	}
	s, err := Read(g.path, ReadOptions{Key: g.key, Shape: g.shape, MaxAge: maxAge, MaxBytes: g.maxBytes})
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Reason: Unreadable, Err: err}
		}
		g.refuse(e.Reason, e.Err)
		return
	}
	g.pending.Store(s)
}

// Bind applies the pending snapshot to the replicas of pool (replica
// keys) the first time a policy sees one; until then nothing is written.
// The import runs in the background (Router.ImportIndex: the index stays
// usable, so the request that triggered Bind does not wait for it);
// writes wait for it to end.
func (g *Writer) Bind(pool []string) {
	if g.seen.Load() {
		return
	}
	g.mu.Lock()
	if g.seen.Load() {
		g.mu.Unlock()
		return
	}
	g.seen.Store(true)
	s := g.pending.Swap(nil)
	if s == nil {
		g.mu.Unlock()
		return
	}
	bs, dropped := s.Beliefs(g.key, pool)
	m := g.m
	m.dropped.Add(float64(dropped))
	if len(bs) == 0 {
		g.refuse(ShapeMismatch, fmt.Errorf("none of the snapshot's %d replicas is in the pool of %d (another replica set, or another key)",
			len(s.Replicas), len(pool)))
		g.mu.Unlock()
		return
	}
	g.imports.Add(1)
	go func() { // owns mu until the import ended
		defer g.imports.Done()
		defer g.mu.Unlock()
		start := time.Now()
		reps, blocks := g.rt.ImportIndex(bs)
		m.loads.WithLabelValues(Loaded).Inc()
		m.loaded.Set(float64(blocks))
		g.logger.Info("ramjet snapshot loaded", zap.String("path", g.path), zap.Int("replicas", reps),
			zap.Int("blocks", blocks), zap.Int("dropped_replicas", dropped), zap.Duration("age", time.Since(s.Written)),
			zap.Duration("took", time.Since(start)))
	}()
}

// Wait waits for the import Bind started, if any.
func (g *Writer) Wait() {
	g.imports.Wait()
}
