package edge

import (
	"context"
	"sync"
	"time"
)

// Finisher is what a Sweeper ends: Finish must be safe to call from
// another goroutine, and more than once.
type Finisher interface{ Finish() }

// Sweeper finishes requests whose context ended, without a
// context.AfterFunc per request (which costs five allocations): Add costs
// none once the list has grown. Its goroutine runs while requests are
// open, sweeping every sweepEvery plus sweepPerState per open request (so
// that thousands of open streams cost a sweep every few milliseconds, not
// a busy core): the delay from a request's end to its Finish is bounded
// by that period. It lingers sweepLinger empty sweeps (about a second)
// before it exits, so that a steady trickle of requests does not start it
// again each time. The zero value is ready to use.
type Sweeper struct {
	mu      sync.Mutex
	open    []openRequest
	running bool
}

type openRequest struct {
	ctx context.Context
	f   Finisher
}

const (
	sweepEvery    = time.Millisecond
	sweepPerState = time.Microsecond
	sweepLinger   = 1000
)

// Add has f finished once ctx is done. A context that is never done (no
// cancellation) keeps f, and the sweeper, forever.
func (s *Sweeper) Add(ctx context.Context, f Finisher) {
	s.mu.Lock()
	s.open = append(s.open, openRequest{ctx, f})
	start := !s.running
	s.running = true
	s.mu.Unlock()
	if start {
		go s.run()
	}
}

func (s *Sweeper) run() {
	t := time.NewTimer(sweepEvery)
	defer t.Stop()
	idle := 0
	for range t.C {
		n := s.Sweep()
		if n > 0 {
			idle = 0
		} else if idle++; idle >= sweepLinger && s.stopIfEmpty() {
			return
		}
		t.Reset(sweepEvery + time.Duration(n)*sweepPerState)
	}
}

// Sweep finishes the requests whose context ended and returns how many are
// left open. The sweeper's goroutine calls it; a caller may too.
func (s *Sweeper) Sweep() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	open := s.open[:0]
	for _, o := range s.open {
		if o.ctx.Err() != nil {
			o.f.Finish()
		} else {
			open = append(open, o)
		}
	}
	clear(s.open[len(open):]) // drop the finished requests
	s.open = open
	if len(open) == 0 && cap(s.open) > 1024 {
		s.open = nil // a burst is over: give its memory back
	}
	return len(open)
}

// stopIfEmpty marks the sweeper stopped when no request is open.
func (s *Sweeper) stopIfEmpty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.open) > 0 {
		return false
	}
	s.running = false
	return true
}
