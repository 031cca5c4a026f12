package selection

import (
	"fmt"
	"testing"
)

// snapshotBenchRouter is a router of 8 replicas holding pairs beliefs in
// all, learned as prompts of 64 blocks.
func snapshotBenchRouter(b *testing.B, pairs int) *Router {
	b.Helper()
	rt, err := NewRouter(Config{IndexBudget: 256 << 20})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 8 {
		if _, err := rt.Register(fmt.Sprintf("127.0.0.1:%d", 8000+i)); err != nil {
			b.Fatal(err)
		}
	}
	for p := 0; p*64 < pairs; p++ {
		rt.Index().Learn(chain(uint64(p)<<20, 64), Slot(p%8))
	}
	return rt
}

func BenchmarkExportIndex(b *testing.B) {
	for _, pairs := range []int{64 << 10, 512 << 10} {
		rt := snapshotBenchRouter(b, pairs)
		b.Run(fmt.Sprintf("pairs=%d", pairs), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(pairs) * 8)
			for b.Loop() {
				rt.ExportIndex(0)
			}
		})
	}
}

func BenchmarkImportIndex(b *testing.B) {
	for _, pairs := range []int{64 << 10, 512 << 10} {
		exp := snapshotBenchRouter(b, pairs).ExportIndex(0)
		b.Run(fmt.Sprintf("pairs=%d", pairs), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(pairs) * 8)
			for b.Loop() {
				b.StopTimer()
				rt := snapshotBenchRouter(b, 0)
				b.StartTimer()
				rt.ImportIndex(exp)
			}
		})
	}
}
