package metrics

import (
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/usage"
)

// BenchmarkEndRequestCold is BenchmarkEndRequest with the core's caches
// filled with other data between two requests (a walk over 2 MiB, not
// timed), as in the proxy, where the client, the engine, Caddy and the
// kernel run between two requests: what it measures is the cache lines a
// request's metrics touch, not their instructions. 8 upstreams, 2 models.
func BenchmarkEndRequestCold(b *testing.B) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	now := time.Now()
	ups := []string{"00aa11bb22c0", "00aa11bb22c1", "00aa11bb22c2", "00aa11bb22c3", "00aa11bb22c4", "00aa11bb22c5", "00aa11bb22c6", "00aa11bb22c7"}
	d := selection.Decision{Index: 0, Reason: selection.ReasonAffinity, Overlap: 700}
	evict := make([]byte, 2<<20)
	var sink byte
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		b.StopTimer()
		for j := 0; j < len(evict); j += 64 {
			evict[j]++
		}
		sink += evict[i%len(evict)]
		x := &Exchange{Upstream: ups[i%len(ups)], Model: []string{"m", "n"}[i/8%2], Status: 200, Start: now, End: now.Add(time.Duration(i%1000) * time.Millisecond),
			Usage: usage.Usage{PromptTokens: 1000, CachedTokens: 400, CompletionTokens: 20}, HasUsage: true}
		i++
		b.StartTimer()
		m.ObserveSelection(x.Upstream, d, false, 30*time.Microsecond)
		m.EndRequest(m.StartRequest(x.Upstream, x.Model), x)
	}
	_ = sink
}
