package metrics

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/usage"
)

// TestCachedChildrenLazyAndReset: the cached children are the vectors'
// own (what a request adds shows in the vector), created on first use only
// (no series appears before its first observation), and Reset drops the
// cache with the children, so that what follows a reset counts again.
func TestCachedChildrenLazyAndReset(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	request := func() {
		m.ObserveSelection("00aa", selection.Decision{Index: 0, Reason: selection.ReasonAffinity}, false, time.Microsecond)
		l := m.StartRequest("m")
		now := time.Now()
		m.EndRequest(l, &Exchange{Upstream: "00aa", Model: "m", Status: 200, Start: now, End: now.Add(time.Millisecond),
			Usage: usage.Usage{PromptTokens: 10, CachedTokens: 4, CompletionTokens: 2}, HasUsage: true})
	}
	if n := testutil.CollectAndCount(m.NoUsage); n != 0 {
		t.Fatalf("%d responses_without_usage series before any response without usage", n)
	}
	request()
	request()
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("00aa", "m", OutcomeOK)); got != 2 {
		t.Fatalf("requests_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.PromptTokens.WithLabelValues("00aa", "m")); got != 20 {
		t.Fatalf("prompt_tokens_total = %v, want 20", got)
	}
	if got := testutil.ToFloat64(m.Decisions.WithLabelValues("00aa", "affinity")); got != 2 {
		t.Fatalf("routing_decisions_total = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(m.NoUsage); n != 0 {
		t.Fatalf("%d responses_without_usage series, want none (every response had usage)", n)
	}
	m.Reset()
	if n := testutil.CollectAndCount(m.Requests); n != 0 {
		t.Fatalf("%d requests_total series after Reset", n)
	}
	request()
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("00aa", "m", OutcomeOK)); got != 1 {
		t.Fatalf("requests_total after Reset = %v, want 1 (a stale cached child?)", got)
	}
	if got := testutil.ToFloat64(m.Inflight.WithLabelValues("m")); got != 0 {
		t.Fatalf("model_inflight_requests = %v, want 0", got)
	}
}

// TestCachedChildrenConcurrent: concurrent first uses of new label values
// all land in the vector (run with -race).
func TestCachedChildrenConcurrent(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				for _, id := range ids {
					m.decisions.get(labelValues{a: id, b: "cold"}).Inc()
				}
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if got := testutil.ToFloat64(m.Decisions.WithLabelValues(id, "cold")); got != 200 {
			t.Errorf("decisions{%s} = %v, want 200", id, got)
		}
	}
}

// BenchmarkEndRequest is one routed request's metrics: the decision, the
// request in flight and its end with usage.
func BenchmarkEndRequest(b *testing.B) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	now := time.Now()
	x := &Exchange{Upstream: "00aa11bb22cc", Model: "m", Status: 200, Start: now, End: now.Add(time.Millisecond),
		Usage: usage.Usage{PromptTokens: 10, CachedTokens: 4, CompletionTokens: 2}, HasUsage: true}
	d := selection.Decision{Index: 0, Reason: selection.ReasonAffinity}
	b.ReportAllocs()
	for b.Loop() {
		m.ObserveSelection(x.Upstream, d, false, time.Microsecond)
		m.EndRequest(m.StartRequest("m"), x)
	}
}
