package fleetstate

import (
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/selection"
)

// Sweeper is the departure sweeper of one fleet: the live members (the
// policies routing over it, of type P) and the goroutine that sweeps.
// Every quarter of depart_after it forgets the replicas that no live
// member's upstream pool has listed for depart_after and that no request
// holds a reservation on (Fleet.Depart).
type Sweeper[P comparable] struct {
	f      *Fleet
	listed func(live []P) (map[string]bool, bool)
	grace  atomic.Int64  // depart_after of the member joined last
	sweeps atomic.Uint64 // sweeps run (tests wait on it)
	logger atomic.Pointer[zap.Logger]
	remove func() // the fleet's unregister hook

	mu   sync.Mutex
	live map[P]bool

	stop chan struct{}
	done chan struct{}
}

// StartSweeper starts the sweeper of f with no member yet. listed is the
// set of replica keys the live members' pools list, false when a member
// has no pool yet; forget is added to f's OnUnregister hooks until Stop.
// grace and logger are those of the first member (Join sets them again).
func StartSweeper[P comparable](f *Fleet, listed func(live []P) (map[string]bool, bool),
	forget func(selection.Slot, string), grace time.Duration, logger *zap.Logger) *Sweeper[P] {
	c := &Sweeper[P]{f: f, listed: listed, live: map[P]bool{},
		stop: make(chan struct{}), done: make(chan struct{})}
	c.remove = f.OnUnregister(forget)
	c.grace.Store(int64(grace))
	c.logger.Store(logger)
	go c.run()
	return c
}

// Join adds the live member p; its depart_after and logger apply from the
// next sweep.
func (c *Sweeper[P]) Join(p P, grace time.Duration, logger *zap.Logger) {
	c.grace.Store(int64(grace))
	c.logger.Store(logger)
	c.mu.Lock()
	c.live[p] = true
	c.mu.Unlock()
}

// Leave removes the member p and reports whether it was the last.
func (c *Sweeper[P]) Leave(p P) (last bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.live, p)
	return len(c.live) == 0
}

// Stop stops the sweeps and removes the unregister hook.
func (c *Sweeper[P]) Stop() {
	close(c.stop)
	<-c.done
	c.remove()
}

// Sweeps is the number of sweeps run.
func (c *Sweeper[P]) Sweeps() uint64 { return c.sweeps.Load() }

// run sweeps every quarter of depart_after (10 ms to 5 s) until stopped.
func (c *Sweeper[P]) run() {
	defer close(c.done)
	t := time.NewTimer(c.interval())
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.Sweep(now)
			t.Reset(c.interval())
		}
	}
}

func (c *Sweeper[P]) interval() time.Duration {
	return min(max(time.Duration(c.grace.Load())/4, 10*time.Millisecond), 5*time.Second)
}

// Sweep forgets the replicas that left every live pool, as of now. It
// decides nothing while a live member has not routed yet (its pool is
// unknown until Caddy hands it to Select): a reload's new config that
// lists the same replicas must not lose their warm index for want of
// traffic.
func (c *Sweeper[P]) Sweep(now time.Time) {
	defer c.sweeps.Add(1)
	c.mu.Lock()
	live := make([]P, 0, len(c.live))
	for p := range c.live {
		live = append(live, p)
	}
	c.mu.Unlock()
	listed, ok := c.listed(live)
	if !ok {
		return
	}
	gone := c.f.Depart(func(key string) bool { return listed[key] }, now, time.Duration(c.grace.Load()))
	if len(gone) == 0 {
		return
	}
	secret := c.f.Secret()
	log := c.logger.Load()
	for _, key := range gone {
		log.Info("replica left the fleet: its index and slot are freed",
			zap.String("fleet", c.f.StateKey), zap.String("route_id", RouteID(secret, key)),
			zap.String("replica", key))
	}
}

// Sweepers holds the Sweeper of every fleet (keyed by K) with a live
// member. Safe for concurrent use.
type Sweepers[K comparable, P comparable] struct {
	mu sync.Mutex
	m  map[K]*Sweeper[P]
}

// Join adds p to the sweeper of k, starting it with start when k has none.
func (s *Sweepers[K, P]) Join(k K, p P, grace time.Duration, logger *zap.Logger, start func() *Sweeper[P]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.m[k]
	if c == nil {
		if s.m == nil {
			s.m = map[K]*Sweeper[P]{}
		}
		c = start()
		s.m[k] = c
	}
	c.Join(p, grace, logger)
}

// Leave removes p from the sweeper of k, stopping it with its last member.
func (s *Sweepers[K, P]) Leave(k K, p P) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.m[k]
	if c == nil || !c.Leave(p) {
		return
	}
	delete(s.m, k)
	c.Stop()
}

// Get is the sweeper of k, nil when none runs.
func (s *Sweepers[K, P]) Get(k K) *Sweeper[P] {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[k]
}
