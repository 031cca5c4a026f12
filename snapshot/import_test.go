package snapshot

import (
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/selection"
)

// bigSnapshot is a snapshot of 8 replicas holding pairs beliefs in all,
// the router it was taken from and the replicas' keys.
func bigSnapshot(tb testing.TB, pairs int) (*Snapshot, []string) {
	tb.Helper()
	reps := pool(8)
	rt := writerRouter(tb, reps, false)
	for p := 0; p*64 < pairs; p++ {
		blocks := make([]uint64, 64)
		for j := range blocks {
			blocks[j] = uint64(p)<<20 | uint64(j+1)
		}
		rt.Index().Learn(blocks, selection.Slot(p%8))
	}
	return &Snapshot{Shape: ShapeOf(rt.Config()), Written: time.Now(), Replicas: FromBeliefs(testKey, rt.ExportIndex(0))}, reps
}

// pendingWriter is a writer over a fresh router of reps with s pending,
// as StartWriter leaves it after reading a verified snapshot.
func pendingWriter(t *testing.T, s *Snapshot, reps []string, m *Metrics) (*Writer, *selection.Router) {
	t.Helper()
	rt := writerRouter(t, reps, false)
	w, _ := startTestWriter(t, rt, filepath.Join(t.TempDir(), "index.snap"), m)
	w.pending.Store(s)
	return w, rt
}

// TestBindImportsInTheBackground: the index answers reads while the import
// Bind started runs, partly imported, the most recent beliefs first.
func TestBindImportsInTheBackground(t *testing.T) {
	s, reps := bigSnapshot(t, 256<<10)
	m := testMetrics()
	w, rt := pendingWriter(t, s, reps, m)
	total := int64(s.Blocks())

	// Replica 0's most recent block is imported in the first pass, the
	// block in the middle of its order halfway through the second: one
	// read (one hold of the read lock) that finds the first and not the
	// second saw the index partly imported, the most recent part first.
	blocks := s.Replicas[0].Blocks
	recent, middle := blocks[len(blocks)-1], blocks[len(blocks)/2]
	var partial, reads atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var depth [selection.MaxReplicas]int32
		var slot0 selection.SlotSet
		slot0.Add(0)
		for {
			select {
			case <-stop:
				return
			default:
			}
			depth[0] = 0
			rt.Index().Depths([]uint64{recent, middle}, slot0, &depth)
			if depth[0] == 1 {
				partial.Add(1)
			}
			reads.Add(1)
		}
	}()
	w.Bind(reps)
	w.Wait()
	close(stop)
	<-done
	if got := rt.Index().Pairs(); got != total {
		t.Fatalf("%d beliefs after the import, want %d", got, total)
	}
	if partial.Load() == 0 {
		t.Errorf("no read of the index during the import (%d reads): the import held it throughout", reads.Load())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkBindFullIndex measures what the request that shows the policy
// its pool waits for, with a snapshot of a full default index (about 840Ki
// beliefs fit 64MiB; 512Ki here): "sync" imports on the request (the
// previous behaviour), "background" is Bind. import-ms is the import's
// wall time; a reader reads the index in a loop meanwhile: reads is how
// many reads completed during the import, read-p999-µs and read-max-ms
// their latency (a read the import holds up waits for at most one chunk
// of it, plus any time the machine did not run the reader). Both modes
// import in chunks (Router.ImportIndex); before, the import held the
// lock throughout and a read waited up to import-ms.
func BenchmarkBindFullIndex(b *testing.B) {
	s, reps := bigSnapshot(b, 512<<10)
	for _, mode := range []string{"sync", "background"} {
		b.Run(mode, func(b *testing.B) {
			var request, imp time.Duration
			var lat []time.Duration
			for b.Loop() {
				b.StopTimer()
				bs, _ := s.Beliefs(testKey, reps)
				rt := writerRouter(b, reps, false)
				g := &Writer{rt: rt, key: testKey, m: testMetrics().fleet(testFleet), logger: zap.NewNop()}
				g.pending.Store(s)
				var stop atomic.Bool
				done := make(chan []time.Duration)
				go func() { // a request reading the index meanwhile
					var depth [selection.MaxReplicas]int32
					var all selection.SlotSet
					all.Add(0)
					var l []time.Duration
					for !stop.Load() && len(l) < 1<<20 {
						t0 := time.Now()
						rt.Index().Depths([]uint64{1}, all, &depth)
						l = append(l, time.Since(t0))
					}
					done <- l
				}()
				b.StartTimer()
				t0 := time.Now()
				if mode == "sync" {
					rt.ImportIndex(bs)
				} else {
					g.Bind(reps)
				}
				request += time.Since(t0)
				g.Wait()
				imp += time.Since(t0)
				b.StopTimer()
				stop.Store(true)
				lat = append(lat, <-done...)
				b.StartTimer()
			}
			n := float64(b.N)
			slices.Sort(lat)
			b.ReportMetric(float64(request.Microseconds())/n, "request-wait-µs")
			b.ReportMetric(float64(imp.Milliseconds())/n, "import-ms")
			b.ReportMetric(float64(len(lat))/n, "reads")
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)*999/1000].Nanoseconds())/1000, "read-p999-µs")
				b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "read-max-ms")
			}
		})
	}
}
