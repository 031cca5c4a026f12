package enginemetrics

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFuse(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	snap := func(running, waiting, used, capacity int64, local Local) Snapshot {
		return Snapshot{ScrapedAt: at, AttemptedAt: at, StaleAfter: 3 * time.Second, Local: local,
			Metrics: RankMetrics{Running: running, Waiting: waiting, KVUsedTokens: used, KVCapacityTokens: capacity,
				HasKVUsage: capacity > 0, KVUsage: float64(used) / float64(max(capacity, 1))}}
	}
	tests := []struct {
		name string
		give Snapshot
		now  time.Time
		want External
	}{
		{
			name: "only this instance's requests: nothing external",
			give: snap(3, 0, 1000, 4000, Local{Inflight: 3}), now: at.Add(time.Second),
			want: External{KVUsedTokens: 1000, KVCapacityTokens: 4000, KVHeld: 1000, KVUsage: 0.25, Fresh: true, Age: time.Second},
		},
		{
			name: "other instances: the excess, split running/waiting in the engine's proportion",
			give: snap(6, 4, 2000, 4000, Local{Inflight: 5, ResidentTokens: 500}), now: at,
			want: External{Running: 3, Waiting: 2, KVUsedTokens: 1500, KVCapacityTokens: 4000, KVHeld: 2000, KVUsage: 0.5, Fresh: true},
		},
		{
			name: "more reserved than the engine reports (requests in transit, stream tails): clamped",
			give: snap(1, 0, 100, 0, Local{Inflight: 4, ResidentTokens: 900}), now: at,
			want: External{KVHeld: 100, Fresh: true},
		},
		{
			name: "no KV figure (no usage, no capacity): KVHeld none",
			give: snap(2, 0, 0, 0, Local{Inflight: 2}), now: at,
			want: External{KVHeld: -1, Fresh: true},
		},
		{
			name: "stale: local only, capacity kept",
			give: snap(9, 9, 3000, 4000, Local{}), now: at.Add(3*time.Second + time.Nanosecond),
			want: External{KVCapacityTokens: 4000, KVHeld: -1},
		},
		{
			name: "never scraped",
			give: Snapshot{StaleAfter: time.Second}, now: at,
			want: External{KVHeld: -1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Fuse(tt.give, tt.now)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Fatalf("Fuse (-want +got):\n%s", diff)
			}
		})
	}
}

// A burst since the scrape is carried by the live reservations, other
// instances' load by External: neither is lost, and this instance's
// requests at the scrape are not counted twice.
func TestFusedLoad(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	// At the scrape: this instance had 2 in flight, the engine ran 5.
	s := Snapshot{ScrapedAt: at, StaleAfter: time.Second, Local: Local{Inflight: 2},
		Metrics: RankMetrics{Running: 5}}
	ext := Fuse(s, at)
	// Since then a burst of 4 more of its own: 6 in flight, 100 tokens pending.
	now := Local{Inflight: 6, PendingPrefill: 100}
	if got, want := FusedLoad(now, ext, 2048), float64((6+3)*2048+100); got != want {
		t.Fatalf("FusedLoad = %v, want %v", got, want)
	}
	if got := ext.LoadTokens(2048); got != 3*2048 {
		t.Fatalf("LoadTokens = %v", got)
	}
	// Stale: exactly the local rule.
	if got := FusedLoad(now, Fuse(s, at.Add(2*time.Second)), 2048); got != 6*2048+100 {
		t.Fatalf("stale FusedLoad = %v", got)
	}
}
