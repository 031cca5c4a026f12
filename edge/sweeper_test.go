package edge

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

type countFinisher struct{ n atomic.Int32 }

func (c *countFinisher) Finish() { c.n.Add(1) }

// TestSweeper: a request is finished once its context ends, never before,
// and the sweeper's own goroutine gets there without a caller's Sweep.
func TestSweeper(t *testing.T) {
	var s Sweeper
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	var f1, f2 countFinisher
	s.Add(ctx1, &f1)
	s.Add(ctx2, &f2)
	if n := s.Sweep(); n != 2 || f1.n.Load() != 0 {
		t.Fatalf("open %d, finished %d: want 2 open, none finished", n, f1.n.Load())
	}
	cancel1()
	deadline := time.Now().Add(10 * time.Second)
	for f1.n.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("an ended request was not finished")
		}
		time.Sleep(time.Millisecond) // polling, not synchronisation
	}
	if f1.n.Load() != 1 || f2.n.Load() != 0 {
		t.Fatalf("finished %d and %d, want 1 and 0", f1.n.Load(), f2.n.Load())
	}
	if n := s.Sweep(); n != 1 {
		t.Fatalf("open %d, want 1", n)
	}
	if a := testing.AllocsPerRun(100, func() { s.Add(ctx2, &f2); s.Sweep() }); a != 0 {
		t.Errorf("Add allocates %v times", a)
	}
}
