package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ramjet-llm/ramjet/selection"
)

// testMetrics are fresh, unregistered Writer metrics (package metrics
// builds the real ones; it imports this package).
func testMetrics() *Metrics {
	fleet, outcome := []string{"fleet"}, []string{"fleet", "outcome"}
	return &Metrics{
		Loads:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "loads"}, outcome),
		Writes:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "writes"}, outcome),
		Dropped:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dropped"}, fleet),
		Loaded:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "loaded"}, fleet),
		LastWrite: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "last_write"}, fleet),
		Bytes:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "bytes"}, fleet),
	}
}

// testFleet is the fleet of the test writers.
const testFleet = "test"

// writerRouter is a router over replicas, each holding 8 blocks of its
// own when learn is set.
func writerRouter(t testing.TB, replicas []string, learn bool) *selection.Router {
	t.Helper()
	rt, err := selection.NewRouter(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range replicas {
		if _, err := rt.Register(k); err != nil {
			t.Fatal(err)
		}
	}
	if learn {
		learnBlocks(t, rt, replicas)
	}
	return rt
}

// learnBlocks has every replica learn 8 blocks of its own.
func learnBlocks(t testing.TB, rt *selection.Router, replicas []string) {
	t.Helper()
	for i, k := range replicas {
		s, ok := rt.Lookup(k)
		if !ok {
			t.Fatalf("%s not registered", k)
		}
		blocks := make([]uint64, 8)
		for j := range blocks {
			blocks[j] = uint64(i+1)<<32 | uint64(j+1)
		}
		rt.Index().Learn(blocks, s)
	}
}

func startTestWriter(t *testing.T, rt *selection.Router, path string, m *Metrics) (*Writer, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	w := StartWriter(WriterOptions{Router: rt, Fleet: testFleet, Path: path, Key: testKey, Interval: 1 << 62, MaxAge: 0,
		MaxBytes: DefaultMaxBytes, Logger: zap.New(core), Metrics: m})
	return w, logs
}

func pool(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("127.0.0.1:%d", 9000+i)
	}
	return out
}

// TestWriterRoundTrip: a Writer that saw its pool writes the index at
// Close; a Writer started on a fresh index over the same replicas reads
// it, and Bind restores every belief.
func TestWriterRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.snap")
	reps := pool(3)
	src := writerRouter(t, reps, false)
	m := testMetrics()
	w, logs := startTestWriter(t, src, path, m)
	learnBlocks(t, src, reps)
	if got := testutil.ToFloat64(m.Loads.WithLabelValues(testFleet, string(Missing))); got != 1 {
		t.Errorf("loads{missing} = %v, want 1", got)
	}
	if e := logs.FilterMessage("ramjet snapshot refused, starting cold").All(); len(e) != 1 || e[0].Level != zapcore.InfoLevel {
		t.Errorf("refusal of a missing snapshot logged %+v, want one info line", e)
	}
	w.Bind(reps)
	w.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Writes.WithLabelValues(testFleet, "ok")); got != 1 {
		t.Fatalf("writes{ok} = %v, want 1", got)
	}
	if e := logs.FilterMessage("ramjet snapshot written").All(); len(e) != 1 || e[0].ContextMap()["trigger"] != "shutdown" {
		t.Errorf("shutdown write logged %+v, want one line with trigger shutdown", e)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Bytes.WithLabelValues(testFleet)); got != float64(fi.Size()) {
		t.Errorf("bytes gauge %v, file is %d bytes", got, fi.Size())
	}

	dst := writerRouter(t, reps[:2], false) // one replica left
	m2 := testMetrics()
	w2, logs2 := startTestWriter(t, dst, path, m2)
	if n := dst.Index().Pairs(); n != 0 {
		t.Fatalf("%d beliefs before Bind, want 0", n)
	}
	w2.Bind(reps[:2])
	w2.Wait()
	if got := testutil.ToFloat64(m2.Loads.WithLabelValues(testFleet, Loaded)); got != 1 {
		t.Errorf("loads{loaded} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m2.Dropped.WithLabelValues(testFleet)); got != 1 {
		t.Errorf("dropped = %v, want 1 (the replica not in the pool)", got)
	}
	if got, want := testutil.ToFloat64(m2.Loaded.WithLabelValues(testFleet)), 16.0; got != want {
		t.Errorf("loaded blocks = %v, want %v", got, want)
	}
	if n := dst.Index().Pairs(); n != 16 {
		t.Errorf("%d beliefs after Bind, want 16", n)
	}
	if e := logs2.FilterMessage("ramjet snapshot loaded").All(); len(e) != 1 {
		t.Errorf("load logged %d lines, want 1", len(e))
	}
	// A second pool changes nothing: the snapshot applies once.
	w2.Bind(reps[:1])
	w2.Wait()
	if got := testutil.ToFloat64(m2.Loads.WithLabelValues(testFleet, Loaded)); got != 1 {
		t.Errorf("loads{loaded} = %v after a second Bind, want 1", got)
	}
	// Close after the policy never sees a pool writes nothing.
	w3, _ := startTestWriter(t, writerRouter(t, reps, false), filepath.Join(t.TempDir(), "other.snap"), testMetrics())
	if err := w3.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), "other.snap")); !os.IsNotExist(err) {
		t.Errorf("a writer that never saw a pool wrote a snapshot: %v", err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestWriterReplicaSetChanged: a snapshot none of whose replicas is in the
// pool is refused as a shape mismatch, with a warning.
func TestWriterReplicaSetChanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.snap")
	reps := pool(4)
	src := writerRouter(t, reps[:2], false)
	w, _ := startTestWriter(t, src, path, testMetrics())
	learnBlocks(t, src, reps[:2])
	w.Bind(reps[:2])
	w.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	m := testMetrics()
	dst := writerRouter(t, reps[2:], false)
	w2, logs := startTestWriter(t, dst, path, m)
	defer w2.Close()
	w2.Bind(reps[2:])
	w2.Wait()
	if got := testutil.ToFloat64(m.Loads.WithLabelValues(testFleet, string(ShapeMismatch))); got != 1 {
		t.Errorf("loads{shape_mismatch} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Dropped.WithLabelValues(testFleet)); got != 2 {
		t.Errorf("dropped = %v, want 2", got)
	}
	e := logs.FilterMessage("ramjet snapshot refused, starting cold").All()
	if len(e) != 1 || e[0].Level != zapcore.WarnLevel || e[0].ContextMap()["reason"] != string(ShapeMismatch) {
		t.Errorf("refusal logged %+v, want one warning with reason shape_mismatch", e)
	}
	if n := dst.Index().Pairs(); n != 0 {
		t.Errorf("%d beliefs after a refused snapshot, want 0", n)
	}
}

// TestWriterKeepsHeldIndex: a fleet that already holds an index (it
// outlived a config change) does not read the snapshot.
func TestWriterKeepsHeldIndex(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.snap")
	m := testMetrics()
	w, logs := startTestWriter(t, writerRouter(t, pool(2), true), path, m)
	defer w.Close()
	for _, o := range Outcomes() {
		if got := testutil.ToFloat64(m.Loads.WithLabelValues(testFleet, o)); got != 0 {
			t.Errorf("loads{%s} = %v, want 0", o, got)
		}
	}
	if e := logs.FilterMessage("ramjet snapshot not read: the fleet already holds an index").All(); len(e) != 1 {
		t.Errorf("logged %d lines for a held index, want 1", len(e))
	}
}
