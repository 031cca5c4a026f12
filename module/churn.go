package module

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
)

// Replicas leaving a fleet (dynamic upstreams whose DNS answer dropped a
// pod, a reload with a changed upstream list): every fleet with a live
// ramjet policy has a departure sweeper that forgets a replica once no live
// policy's upstream pool has listed it for depart_after and no request
// holds a reservation on it (fleetstate.Fleet.Depart). Its index entries,
// load, route id, outlier and integrity state are dropped and its slot is
// reused by the next replica, which starts cold.

// DefaultDepartAfter is depart_after's default.
const DefaultDepartAfter = fleetstate.DefaultDepartAfter

// churnState is the departure sweeper of one fleet: the live policies
// routing over it and the goroutine that sweeps.
type churnState struct {
	f      *fleet
	grace  atomic.Int64  // depart_after of the policy provisioned last
	sweeps atomic.Uint64 // sweeps run (tests wait on it)
	logger atomic.Pointer[zap.Logger]
	remove func() // the fleet's unregister hook

	mu   sync.Mutex
	live map[*RamjetSelection]bool

	stop chan struct{}
	done chan struct{}
}

// churns holds the sweeper of every fleet with a live policy.
var churns = struct {
	sync.Mutex
	m map[*fleet]*churnState
}{m: map[*fleet]*churnState{}}

// departuresCollector is ramjet_upstream_departures_total, created once
// and registered into every config's metrics registry.
var departuresCollector = sync.OnceValue(func() prometheus.Collector {
	return metrics.NewDeparturesCollector(func() []*fleetstate.Fleet {
		fs := current.Values()
		out := make([]*fleetstate.Fleet, len(fs))
		for i, f := range fs {
			out[i] = f.Fleet
		}
		return out
	})
})

// provisionChurn fills and checks depart_after and joins the policy to its
// fleet's sweeper, starting it for a new fleet.
func (s *RamjetSelection) provisionChurn(ctx caddy.Context) error {
	if s.DepartAfter == 0 {
		s.DepartAfter = caddy.Duration(DefaultDepartAfter)
	}
	if s.DepartAfter < 0 {
		return fmt.Errorf("depart_after must be positive, got %v", time.Duration(s.DepartAfter))
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := metrics.Register(reg, departuresCollector()); err != nil {
			return err
		}
	}
	churns.Lock()
	defer churns.Unlock()
	c := churns.m[s.fleet]
	if c == nil {
		c = &churnState{f: s.fleet, live: map[*RamjetSelection]bool{},
			stop: make(chan struct{}), done: make(chan struct{})}
		c.remove = s.fleet.OnUnregister(c.forget)
		churns.m[s.fleet] = c
		c.grace.Store(int64(s.DepartAfter))
		c.logger.Store(s.logger)
		go c.run()
	}
	c.grace.Store(int64(s.DepartAfter))
	c.logger.Store(s.logger)
	c.mu.Lock()
	c.live[s] = true
	c.mu.Unlock()
	return nil
}

// cleanupChurn leaves the fleet's sweeper, stopping it with the fleet's
// last policy.
func (s *RamjetSelection) cleanupChurn() {
	churns.Lock()
	defer churns.Unlock()
	c := churns.m[s.fleet]
	if c == nil {
		return
	}
	c.mu.Lock()
	delete(c.live, s)
	last := len(c.live) == 0
	c.mu.Unlock()
	if !last {
		return
	}
	delete(churns.m, s.fleet)
	close(c.stop)
	<-c.done
	c.remove()
}

// run sweeps every quarter of depart_after (10 ms to 5 s) until stopped.
func (c *churnState) run() {
	defer close(c.done)
	t := time.NewTimer(c.interval())
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.sweep(now)
			t.Reset(c.interval())
		}
	}
}

func (c *churnState) interval() time.Duration {
	return min(max(time.Duration(c.grace.Load())/4, 10*time.Millisecond), 5*time.Second)
}

// sweep forgets the replicas that left every live pool. It decides nothing
// while a live policy has not routed yet (its pool is unknown until Caddy
// hands it to Select): a reload's new config that lists the same replicas
// must not lose their warm index for want of traffic.
func (c *churnState) sweep(now time.Time) {
	defer c.sweeps.Add(1)
	listed, ok := c.listed()
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
			zap.String("fleet", c.f.StateKey), zap.String("route_id", fleetstate.RouteID(secret, key)),
			zap.String("replica", key))
	}
}

// listed is the set of replica keys the live policies' pools list, false
// when a live policy has no pool yet.
func (c *churnState) listed() (map[string]bool, bool) {
	c.mu.Lock()
	live := make([]*RamjetSelection, 0, len(c.live))
	for p := range c.live {
		live = append(live, p)
	}
	c.mu.Unlock()
	keys := map[string]bool{}
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	for _, p := range live {
		v, ok := c.f.views[p]
		if !ok {
			return nil, false
		}
		for i, k := range v.keys {
			if v.slots[i] >= 0 {
				keys[k] = true
			}
		}
	}
	return keys, true
}

// forget resets the module's per-slot state of a replica that left (the
// fleet's unregister hook, run before the slot is reused): integrity stops
// checking it and no longer holds the slot out.
func (c *churnState) forget(s selection.Slot, key string) {
	g := integrityOf(c.f)
	if g == nil {
		return
	}
	g.Forget(s, key)
}
