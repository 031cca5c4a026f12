package kvindex

import (
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
