package kvindex

import (
	"math"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// OnStored hands every applied BlockStored event of a bound replica to
// the hook under the replica's slot, with its block count, block size and
// the index's clock; other tiers, removals, unbound replicas and a
// rebinding are handled; nil turns it off.
func TestPreciseOnStored(t *testing.T) {
	now := time.Unix(200, 0)
	p, err := NewPrecise(PreciseConfig{
		Index:   Config{BlockSize: 2, Now: func() time.Time { return now }},
		Engines: []PreciseEngine{{Feed: Endpoint{Replica: "a"}}, {Feed: Endpoint{Replica: "b"}}, {Feed: Endpoint{Replica: "c"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	type run struct {
		s          selection.Slot
		blocks, bt int
		at         time.Time
	}
	var got []run
	p.OnStored(func(s selection.Slot, blocks, bt int, at time.Time) { got = append(got, run{s, blocks, bt, at}) })
	p.Bind(5, "a")
	p.Bind(9, "b")
	ra, _ := p.Index().Lookup("a")
	rb, _ := p.Index().Lookup("b")
	rc, _ := p.Index().Lookup("c")

	cpu := storedEv(0, false, 2, []uint32{1, 2}, 11)
	cpu.Medium = "CPU"
	p.Index().Apply(ra, batchOf(
		storedEv(0, false, 2, []uint32{1, 2, 3, 4, 5, 6}, 1, 2, 3),
		Event{Kind: KindBlockRemoved, BlockHashes: []uint64{3}, Medium: "GPU"},
		cpu,
	))
	p.Index().Apply(rb, batchOf(storedEv(0, false, 2, []uint32{7, 8}, 4)))
	p.Index().Apply(rc, batchOf(storedEv(0, false, 2, []uint32{7, 8}, 5))) // c is not bound
	want := []run{{5, 3, 2, now}, {9, 1, 2, now}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("runs %+v, want %+v", got, want)
	}

	p.Bind(5, "b") // slot 5 now b; a unbound
	p.Bind(9, "c")
	got = got[:0]
	p.Index().Apply(ra, batchOf(storedEv(0, false, 2, []uint32{1, 2}, 6)))
	p.Index().Apply(rb, batchOf(storedEv(0, false, 2, []uint32{1, 2, 3, 4}, 7, 8)))
	p.Index().Apply(rc, batchOf(storedEv(0, false, 2, []uint32{1, 2}, 9)))
	want = []run{{5, 2, 2, now}, {9, 1, 2, now}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("after rebinding: runs %+v, want %+v", got, want)
	}

	p.OnStored(nil)
	got = got[:0]
	p.Index().Apply(rb, batchOf(storedEv(0, false, 2, []uint32{5, 5}, 10)))
	if len(got) != 0 {
		t.Fatalf("hook off: runs %+v", got)
	}
}

// The stored-run hook gets the engine's publication time (the batch's ts)
// where it is plausible, the index's clock otherwise: a batch delivered
// late by a stalled feed keeps the time its engine stored the blocks.
func TestPublishedAt(t *testing.T) {
	now := time.Unix(1_700_000_000, 500_000_000)
	sec := func(d time.Duration) float64 { return float64(now.Add(d).UnixNano()) / 1e9 }
	for _, tt := range []struct {
		name string
		ts   float64
		want time.Time
	}{
		{"300ms before delivery", sec(-300 * time.Millisecond), now.Add(-300 * time.Millisecond)},
		{"at delivery", sec(0), now},
		{"no ts", 0, now},
		{"negative", -5, now},
		{"NaN", math.NaN(), now},
		{"Inf", math.Inf(1), now},
		{"overflowing", 1e300, now},
		{"ahead of this host", sec(50 * time.Millisecond), now},
		{"older than MaxPublishLag", sec(-MaxPublishLag - time.Millisecond), now},
	} {
		if got := publishedAt(tt.ts, now); got.Sub(tt.want).Abs() > time.Microsecond {
			t.Errorf("%s: publishedAt(%v) = %v, want %v", tt.name, tt.ts, got, tt.want)
		}
	}

	p, err := NewPrecise(PreciseConfig{
		Index:   Config{BlockSize: 2, Now: func() time.Time { return now }},
		Engines: []PreciseEngine{{Feed: Endpoint{Replica: "a"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var at []time.Time
	p.OnStored(func(_ selection.Slot, _, _ int, t time.Time) { at = append(at, t) })
	p.Bind(0, "a")
	ra, _ := p.Index().Lookup("a")
	b := batchOf(storedEv(0, false, 2, []uint32{1, 2}, 1))
	b.TS = sec(-200 * time.Millisecond)
	p.Index().Apply(ra, b)
	if len(at) != 1 || !at[0].Equal(publishedAt(b.TS, now)) || now.Sub(at[0]) < 199*time.Millisecond {
		t.Fatalf("hook times %v, want the batch's ts (200ms before %v)", at, now)
	}
}
