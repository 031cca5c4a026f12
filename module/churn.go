package module

import (
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

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

// churns holds the departure sweeper (fleetstate.Sweeper) of every fleet
// with a live policy.
var churns fleetstate.Sweepers[*fleet, *RamjetSelection]

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

// provisionChurn joins the policy to its
// fleet's sweeper, starting it for a new fleet.
func (s *RamjetSelection) provisionChurn(ctx caddy.Context) error {
	if err := register(ctx.GetMetricsRegistry(), departuresCollector()); err != nil {
		return err
	}
	f := s.fleet
	churns.Join(f, s, time.Duration(s.DepartAfter), s.logger, func() *fleetstate.Sweeper[*RamjetSelection] {
		return fleetstate.StartSweeper(f.Fleet, f.listed, f.forget, time.Duration(s.DepartAfter), s.logger)
	})
	return nil
}

// cleanupChurn leaves the fleet's sweeper, stopping it with the fleet's
// last policy.
func (s *RamjetSelection) cleanupChurn() {
	churns.Leave(s.fleet, s)
}

// listed is the set of replica keys the pools of the live policies list,
// false when a live policy has no pool yet (the sweeper's input).
func (f *fleet) listed(live []*RamjetSelection) (map[string]bool, bool) {
	keys := map[string]bool{}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range live {
		v, ok := f.views[p]
		if !ok {
			return nil, false
		}
		for _, k := range v.Tracked() {
			keys[k] = true
		}
	}
	return keys, true
}

// forget resets the module's per-slot state of a replica that left (the
// fleet's unregister hook, run before the slot is reused): integrity stops
// checking it and no longer holds the slot out.
func (f *fleet) forget(s selection.Slot, key string) {
	g := integrityOf(f)
	if g == nil {
		return
	}
	g.Forget(s, key)
}
