package fleetstate

import (
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

func TestKVFeeds(t *testing.T) {
	got := KVFeeds([]kvindex.ReplicaStats{
		{ID: "127.0.0.1:8001", Healthy: true, Fresh: true},
		{ID: "127.0.0.1:8002", Healthy: true},
		{ID: "127.0.0.1:8003", Unhealthy: "orphans"},
	})
	want := map[string]*KVFeedHealth{
		"127.0.0.1:8001": {Healthy: true},
		"127.0.0.1:8002": {Reason: "not_fresh"},
		"127.0.0.1:8003": {Reason: "stores_not_landing: orphans"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
}

func TestEngineStates(t *testing.T) {
	now := time.Now()
	got := EngineStates([]enginemetrics.Snapshot{
		{Key: "127.0.0.1:8002", ID: "bbbb", ScrapedAt: now.Add(-time.Second), AttemptedAt: now.Add(-time.Second)},
		{Key: "127.0.0.1:8003"}, // not routed: no id, left out
		{Key: "127.0.0.1:8001", ID: "aaaa"},
	}, now)
	if len(got) != 2 || got[0].Upstream != "aaaa" || got[1].Upstream != "bbbb" {
		t.Fatalf("states %+v, want aaaa then bbbb", got)
	}
	if got[0].Result != "" || got[0].ScrapedAt != nil {
		t.Errorf("never scraped: result %q scraped_at %v", got[0].Result, got[0].ScrapedAt)
	}
	if got[1].ScrapedAt == nil || got[1].AgeSeconds < 0.99 || got[1].AgeSeconds > 1.01 {
		t.Errorf("scraped a second ago: %v, age %v", got[1].ScrapedAt, got[1].AgeSeconds)
	}
}

func TestNewExplainSession(t *testing.T) {
	ss := integrity.NewSessionShadow(8)
	ids := map[selection.Slot]string{0: "id0", 1: "id1"}
	slotID := func(s selection.Slot) string { return ids[s] }
	if es := NewExplainSession(ss, "s1", slotID, "id1"); es.Known || !es.Agree {
		t.Fatalf("new session: %+v, want unknown and agreeing", es)
	}
	ss.Record(xxhashOf("s1"), 0, func(int) bool { return true })
	es := NewExplainSession(ss, "s1", slotID, "id1")
	if !es.Known || es.StickyUpstream != "id0" || es.Agree || es.Counts["new"] != 1 {
		t.Fatalf("known session on slot 0, decided id1: %+v", es)
	}
}

func xxhashOf(s string) uint64 { return xxhash.Sum64String(s) }
