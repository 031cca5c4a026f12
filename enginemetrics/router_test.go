package enginemetrics

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/selection"
)

func TestTargetsFor(t *testing.T) {
	ref := func(key, id string, rank int) ReplicaRef { return ReplicaRef{Key: key, ID: id, Rank: rank} }
	got := TargetsFor("https", "/metrics", []DialReplica{
		{Dial: "127.0.0.1:8002", ReplicaRef: ref("127.0.0.1:8002#0", "b0", 0)},
		{Dial: "127.0.0.1:8001", ReplicaRef: ref("127.0.0.1:8001", "a", -1)},
		{Dial: "127.0.0.1:8002", ReplicaRef: ref("127.0.0.1:8002#1", "b1", 1)},
		{Dial: "127.0.0.1:8001", ReplicaRef: ref("127.0.0.1:8001", "a", -1)}, // a second pool's view
	})
	want := []Target{
		{URL: "https://127.0.0.1:8001/metrics", Replicas: []ReplicaRef{ref("127.0.0.1:8001", "a", -1)}},
		{URL: "https://127.0.0.1:8002/metrics", Replicas: []ReplicaRef{ref("127.0.0.1:8002#0", "b0", 0), ref("127.0.0.1:8002#1", "b1", 1)}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestRouterFeed(t *testing.T) {
	var f RouterFeed
	if got := f.Local("127.0.0.1:8001"); got != (Local{}) {
		t.Fatalf("no router: %+v", got)
	}
	f.Push(Snapshot{Key: "127.0.0.1:8001"}) // no router: nothing to do
	rt, err := selection.NewRouter(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := rt.Register("127.0.0.1:8001")
	if err != nil {
		t.Fatal(err)
	}
	f.Set(rt)
	res := rt.Reserve(s, 100)
	defer res.Release()
	if got := f.Local("127.0.0.1:8001"); got.Inflight != 1 || got.PendingPrefill != 100 {
		t.Fatalf("local %+v, want 1 in flight, 100 pending", got)
	}
	now := time.Now()
	f.Push(Snapshot{Key: "127.0.0.1:8001", ScrapedAt: now, AttemptedAt: now,
		Metrics: RankMetrics{Running: 3, Waiting: 2, KVCapacityTokens: 4096}})
	if got := rt.Capacity(s); got != 4096 {
		t.Fatalf("capacity %d, want 4096", got)
	}
	// The others' requests (5 on the engine, 1 of ours) reach the router,
	// split in the engine's proportion; the engine's KV figure does not
	// (External.Apply).
	f.Push(Snapshot{Key: "127.0.0.1:8001", ScrapedAt: now, AttemptedAt: now, StaleAfter: time.Hour, Local: f.Local("127.0.0.1:8001"),
		Metrics: RankMetrics{Running: 3, Waiting: 2, KVUsedTokens: 3000, KVCapacityTokens: 4096}})
	if r, w, kv := rt.ExternalLoad(s); r+w != 4 || w != 2 || kv != 0 {
		t.Fatalf("external load %d, %d, %d; want 4 requests (2 waiting), no KV", r, w, kv)
	}
	// The engine's whole KV usage goes to SetEngineKV (read only by
	// selection.Options.EngineOverflow).
	if used, ok := rt.EngineKV(s); !ok || used != 3000 {
		t.Fatalf("engine KV %d, %v; want 3000", used, ok)
	}
	if !rt.ExternalFresh(s) {
		t.Fatal("fresh snapshot: the slot is not marked fresh (the others'-queues prior would count the queue twice)")
	}
	// A stale snapshot: local reservations only.
	old := now.Add(-time.Hour)
	f.Push(Snapshot{Key: "127.0.0.1:8001", ScrapedAt: old, AttemptedAt: old, StaleAfter: time.Second,
		Metrics: RankMetrics{Running: 9, KVCapacityTokens: 4096}})
	if r, w, kv := rt.ExternalLoad(s); r+w+kv != 0 {
		t.Fatalf("stale snapshot: external load %d, %d, %d", r, w, kv)
	}
	if used, ok := rt.EngineKV(s); ok {
		t.Fatalf("stale snapshot: engine KV %d", used)
	}
	if rt.ExternalFresh(s) {
		t.Fatal("stale snapshot: the slot is still marked fresh (no fallback to the others'-queues prior)")
	}
}

// engine_metrics' queue and queue_sat are finite numbers, 0 (off) or more.
func TestSettingsQueue(t *testing.T) {
	for _, tt := range []struct {
		queue float64
		ok    bool
	}{{0, true}, {16384, true}, {-1, false}, {math.NaN(), false}, {math.Inf(1), false}} {
		s := Settings{Queue: tt.queue}
		s.SetDefaults()
		if err := s.Validate(); (err == nil) != tt.ok {
			t.Errorf("queue %v: error %v, want ok %v", tt.queue, err, tt.ok)
		}
		s = Settings{QueueSat: tt.queue}
		s.SetDefaults()
		if err := s.Validate(); (err == nil) != tt.ok {
			t.Errorf("queue_sat %v: error %v, want ok %v", tt.queue, err, tt.ok)
		}
	}
}
