package module

import (
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
)

// DefaultStateKey names the fleet state of a policy without state_key.
const DefaultStateKey = fleetstate.DefaultStateKey

// fleets holds the state that survives config reloads and admin POST /load:
// one *fleet per state_key and index-relevant configuration. A policy takes
// a reference in Provision and drops it in Cleanup; a reload provisions the
// new config before cleaning up the old, so the fleet (index, reservations)
// carries over. Requests of the old config still release into it.
var fleets = caddy.NewUsagePool()

// current maps a state_key to the fleet provisioned last under it, for
// lookupFleet.
var current fleetstate.Latest[*fleet]

// lookupFleet returns the fleet most recently provisioned under stateKey
// ("" means DefaultStateKey), or nil when no live policy uses it. It is
// the accessor for the /health, /v1/models, metrics and admin code:
//
//	f := lookupFleet("")
//	f.Router()     // the selection.Router: Index(), Load(slot), Config()
//	f.replicas()   // every known replica: key, opaque id, slot, load, health
//	f.RouteID(key) // the opaque X-Ramjet-Upstream id of a replica key
func lookupFleet(stateKey string) *fleet {
	if stateKey == "" {
		stateKey = DefaultStateKey
	}
	f, _ := current.Get(stateKey)
	return f
}

// fleet is a fleetstate.Fleet (router, route ids, outlier detector) kept
// in the fleets pool, with what Caddy adds: the upstream pools the live
// policies route over (for health snapshots) and the precise path's
// preflight. Safe for concurrent use.
type fleet struct {
	*fleetstate.Fleet

	mu sync.Mutex
	// views are the upstream pools the live policies last routed over.
	views map[*RamjetSelection]*poolView

	// kv is the precise path's preflight of the policy provisioned last
	// with kv on, nil when none: the ramjet handler runs it ahead of
	// reverse_proxy.
	kv atomic.Pointer[kvPreflight]
}

// Destruct implements caddy.Destructor: the last policy using the fleet
// was cleaned up.
func (f *fleet) Destruct() error {
	current.Drop(f.StateKey, f)
	return nil
}

// acquireFleet takes a reference on the fleet for (stateKey, cfg),
// creating it when the index-relevant configuration changed. The returned
// pool key must be passed to releaseFleet.
func acquireFleet(stateKey string, cfg selection.Config, secret []byte) (*fleet, *selection.Router, string, error) {
	key := fleetstate.PoolKey(stateKey, cfg)
	v, _, err := fleets.LoadOrNew(key, func() (caddy.Destructor, error) {
		fs, err := fleetstate.New(stateKey, key, cfg)
		if err != nil {
			return nil, err
		}
		// Long prompts' learns leave the request's path (selection/learnq.go).
		fs.Base().Index().SetLearnQueue(selection.DefaultLearnQueueBlocks)
		return &fleet{Fleet: fs, views: make(map[*RamjetSelection]*poolView)}, nil
	})
	if err != nil {
		return nil, nil, "", err
	}
	f := v.(*fleet)
	// Knobs that the index does not depend on are retuned in place: the
	// fleet keeps what it learned.
	rt, err := f.Tune(cfg)
	if err != nil {
		_, _ = fleets.Delete(key)
		return nil, nil, "", err
	}
	f.SetSecret(secret)
	current.Set(stateKey, f)
	return f, rt, key, nil
}

// releaseFleet drops a reference taken by acquireFleet.
func releaseFleet(key string) error {
	_, err := fleets.Delete(key)
	return err
}

// setView records the pool a policy routes over (for health snapshots).
func (f *fleet) setView(p *RamjetSelection, v *poolView) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.views[p] = v
}

// dropView forgets a policy's pool (Cleanup).
func (f *fleet) dropView(p *RamjetSelection) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.views, p)
}

// replicas returns every replica the fleet knows, by slot. Health comes
// from the upstream pools of the live policies, which are known once a
// policy has routed its first request (Caddy hands the pool to Select
// only).
func (f *fleet) replicas() []fleetstate.Replica {
	out := f.Replicas()
	n := len(out)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, v := range f.views {
		for i, up := range v.pool {
			s := v.Slots[i]
			if s < 0 || int(s) >= n {
				continue
			}
			r := &out[s]
			r.Known = true
			r.Rank = v.Ranks[i]
			r.Profile = v.Profiles[i]
			if up.Host != nil {
				r.Healthy = r.Healthy || up.Healthy()
				r.Available = r.Available || up.Available()
				r.Fails = up.Host.Fails()
				r.Requests = up.Host.NumRequests()
			}
		}
	}
	return out
}

// snapshot reads the fleet with the health of its upstream pools.
func (f *fleet) snapshot() fleetstate.Snapshot {
	reps := f.replicas()
	for i := range reps {
		reps[i].Integrity = integrityStatus(f, reps[i].Key) // integrity.go
	}
	return f.Snapshot(reps)
}

// snapshotFleets reads every live fleet.
func snapshotFleets() []fleetstate.Snapshot {
	fs := current.Values()
	out := make([]fleetstate.Snapshot, len(fs))
	for i, f := range fs {
		out[i] = f.snapshot()
	}
	return out
}

// poolView is the fleet's View of one upstream pool slice (each
// upstream's replica key, slot, rank and opaque id), so that Select does no
// string work. It is rebuilt when Caddy hands Select a different pool (a
// reload or dynamic upstreams).
type poolView struct {
	pool reverseproxy.UpstreamPool
	fleetstate.View
}
