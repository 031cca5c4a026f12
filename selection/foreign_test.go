package selection

import (
	"testing"
	"time"
)

func TestForeignPrefill(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const bt = 16
	tests := []struct {
		name string
		run  func(f *ForeignPrefill) int64 // returns Pending at the end
		want int64
	}{
		{"a foreign run counts", func(f *ForeignPrefill) int64 {
			f.Stored(0, 8, bt, 0, at(0))
			return f.Pending(0, at(0))
		}, 128},
		{"decode-sized runs do not", func(f *ForeignPrefill) int64 {
			f.Stored(0, 1, bt, 0, at(0))
			f.Stored(0, 3, bt, 0, at(1))
			return f.Pending(0, at(1))
		}, 0},
		{"own credit absorbs own blocks", func(f *ForeignPrefill) int64 {
			f.Routed(0, 100)
			f.Stored(0, 8, bt, 100, at(0)) // 128 stored: 100 own, 28 foreign
			return f.Pending(0, at(0))
		}, 28},
		{"credit dropped once nothing of ours is pending", func(f *ForeignPrefill) int64 {
			f.Routed(0, 1000)
			f.FirstToken(0, at(0))
			f.Stored(0, 8, bt, 0, at(50)) // within grace: ours
			f.Stored(0, 8, bt, 0, at(500))
			return f.Pending(0, at(500))
		}, 128},
		{"decays with tau", func(f *ForeignPrefill) int64 {
			f.Stored(0, 64, bt, 0, at(0)) // 1024
			return f.Pending(0, at(1000))
		}, 377}, // 1024 / e
		{"slots are separate; reset drops", func(f *ForeignPrefill) int64 {
			f.Stored(1, 8, bt, 0, at(0))
			f.Stored(0, 8, bt, 0, at(0))
			f.Reset(0)
			return f.Pending(0, at(0)) + 1000*f.Pending(1, at(0))
		}, 128000},
		{"out of range slots are ignored", func(f *ForeignPrefill) int64 {
			f.Stored(-1, 8, bt, 0, at(0))
			f.Stored(MaxReplicas, 8, bt, 0, at(0))
			f.Routed(-1, 5)
			return f.Pending(-1, at(0)) + f.Pending(MaxReplicas, at(0))
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.run(NewForeignPrefill()); got != tt.want {
				t.Fatalf("pending = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestForeignPrefillApply(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
	f := NewForeignPrefill()
	now := time.Unix(5, 0)
	f.Stored(cands[0].Slot, 10, 16, 0, now)
	f.Apply(rt, cands[0].Slot, now)
	if got := rt.ExternalPrefill(cands[0].Slot); got != 160 {
		t.Fatalf("applied %d, want 160", got)
	}
}
