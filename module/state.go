package module

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

// DefaultStateKey names the fleet state of a policy without state_key.
const DefaultStateKey = "default"

// fleets holds the state that survives config reloads and admin POST /load:
// one *fleet per state_key and index-relevant configuration. A policy takes
// a reference in Provision and drops it in Cleanup; a reload provisions the
// new config before cleaning up the old, so the fleet (index, reservations)
// carries over. Requests of the old config still release into it.
var fleets = caddy.NewUsagePool()

// current maps a state_key to the fleet provisioned last under it, for
// lookupFleet: an immutable map replaced on every change (rare), so that
// lookups on the request path take no lock.
var current struct {
	sync.Mutex // serialises writers
	m          atomic.Pointer[map[string]*fleet]
}

// setCurrent points key at f, or removes key when f is nil and key still
// points at old.
func setCurrent(key string, f, old *fleet) {
	current.Lock()
	defer current.Unlock()
	next := make(map[string]*fleet)
	if m := current.m.Load(); m != nil {
		for k, v := range *m {
			next[k] = v
		}
	}
	if f != nil {
		next[key] = f
	} else if next[key] == old {
		delete(next, key)
	}
	current.m.Store(&next)
}

// lookupFleet returns the fleet most recently provisioned under stateKey
// ("" means DefaultStateKey), or nil when no live policy uses it. It is
// the accessor for the /health, /v1/models, metrics and admin code:
//
//	f := lookupFleet("")
//	f.router()     // the selection.Router: Index(), Load(slot), Config()
//	f.replicas()   // every known replica: key, opaque id, slot, load, health
//	f.routeID(key) // the opaque X-Ramjet-Upstream id of a replica key
func lookupFleet(stateKey string) *fleet {
	if stateKey == "" {
		stateKey = DefaultStateKey
	}
	m := current.m.Load()
	if m == nil {
		return nil
	}
	return (*m)[stateKey]
}

// fleetKeys lists the state keys of every live fleet, sorted.
func fleetKeys() []string {
	m := current.m.Load()
	if m == nil {
		return nil
	}
	keys := make([]string, 0, len(*m))
	for k := range *m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// fleet is the routing state of one set of replicas shared by every policy
// with the same state_key: the selection.Router (index, registry, live
// load), the route-id secret, and the upstream pools the live policies
// route over (for health snapshots). Safe for concurrent use.
type fleet struct {
	stateKey string
	poolKey  string
	rt       *selection.Router
	created  time.Time

	mu     sync.Mutex
	secret []byte
	// views are the upstream pools the live policies last routed over.
	views map[*RamjetSelection]*poolView
	// ids[slot] is the opaque route id of each registered replica, under
	// the current secret; replaced (copy on write) on registration.
	ids atomic.Pointer[[]string]

	// tuned is the Router with the knobs of the most recently provisioned
	// policy (sharing rt's index, registry and load): what explain and the
	// dashboard score with.
	tuned atomic.Pointer[selection.Router]

	// kv is the precise path's preflight of the policy provisioned last
	// with kv on, nil when none: the ramjet handler runs it ahead of
	// reverse_proxy.
	kv atomic.Pointer[kvPreflight]

	// outlier is the fleet's outlier detector (outlier.go), replaced when
	// a policy is provisioned with other outlier settings.
	outlier atomic.Pointer[selection.Outlier]
}

// detector returns the fleet's outlier detector.
func (f *fleet) detector() *selection.Outlier { return f.outlier.Load() }

// setOutlier installs a detector with cfg unless the current one has the
// same settings (it then keeps what it learned).
func (f *fleet) setOutlier(cfg selection.OutlierConfig) {
	cfg.SetDefaults()
	f.mu.Lock()
	defer f.mu.Unlock()
	if o := f.outlier.Load(); o != nil && o.Config() == cfg {
		return
	}
	f.outlier.Store(selection.NewOutlier(cfg, nil))
}

// router returns the fleet's routing core, with the knobs of the most
// recently provisioned policy.
func (f *fleet) router() *selection.Router {
	if rt := f.tuned.Load(); rt != nil {
		return rt
	}
	return f.rt
}

// Destruct implements caddy.Destructor: the last policy using the fleet
// was cleaned up.
func (f *fleet) Destruct() error {
	setCurrent(f.stateKey, nil, f)
	return nil
}

// acquireFleet takes a reference on the fleet for (stateKey, cfg),
// creating it when the index-relevant configuration changed. The returned
// pool key must be passed to releaseFleet.
func acquireFleet(stateKey string, cfg selection.Config, secret []byte) (*fleet, *selection.Router, string, error) {
	key := fleetPoolKey(stateKey, cfg)
	v, _, err := fleets.LoadOrNew(key, func() (caddy.Destructor, error) {
		rt, err := selection.NewRouter(cfg)
		if err != nil {
			return nil, err
		}
		f := &fleet{stateKey: stateKey, poolKey: key, rt: rt, created: time.Now(),
			views: make(map[*RamjetSelection]*poolView)}
		empty := []string{}
		f.ids.Store(&empty)
		f.outlier.Store(selection.NewOutlier(selection.OutlierConfig{}, nil))
		return f, nil
	})
	if err != nil {
		return nil, nil, "", err
	}
	f := v.(*fleet)
	// Knobs that the index does not depend on are retuned in place: the
	// fleet keeps what it learned.
	rt := f.rt
	cfg.SetDefaults()
	if cfg != rt.Config() {
		if rt, err = f.rt.Retune(cfg); err != nil {
			_, _ = fleets.Delete(key)
			return nil, nil, "", err
		}
	}
	f.tuned.Store(rt)
	f.setSecret(secret)
	setCurrent(stateKey, f, nil)
	return f, rt, key, nil
}

// releaseFleet drops a reference taken by acquireFleet.
func releaseFleet(key string) error {
	_, err := fleets.Delete(key)
	return err
}

// fleetPoolKey is state_key plus a hash of the index shape of the
// configuration (block_tokens, prefix_tokens, chars_per_token,
// index_budget): a change to it starts a new Router (and a cold index);
// other knobs are retuned on the same state.
func fleetPoolKey(stateKey string, cfg selection.Config) string {
	cfg.SetDefaults()
	b, _ := json.Marshal(cfg.IndexShape())
	return fmt.Sprintf("ramjet/%s/%016x", stateKey, xxhash.Sum64(b))
}

// processSecret keys route ids when no route_id_secret is configured: ids
// are then stable across reloads but not across restarts or instances.
var processSecret = sync.OnceValue(func() []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Errorf("ramjet: reading random route-id secret: %w", err))
	}
	return b
})

// setSecret switches the route-id secret, recomputing every id.
func (f *fleet) setSecret(secret []byte) {
	if len(secret) == 0 {
		secret = processSecret()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if hmac.Equal(f.secret, secret) {
		return
	}
	f.secret = append([]byte(nil), secret...)
	n := f.rt.Len()
	ids := make([]string, n)
	for s := range n {
		ids[s] = routeID(f.secret, f.rt.Key(selection.Slot(s)))
	}
	f.ids.Store(&ids)
}

// register returns the slot and route id of a replica key.
func (f *fleet) register(key string) (selection.Slot, string, error) {
	s, err := f.rt.Register(key)
	if err != nil {
		return -1, "", err
	}
	if ids := *f.ids.Load(); int(s) < len(ids) {
		return s, ids[s], nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	old := *f.ids.Load()
	if int(s) < len(old) {
		return s, old[s], nil
	}
	n := f.rt.Len()
	ids := make([]string, n)
	copy(ids, old)
	for i := len(old); i < n; i++ {
		ids[i] = routeID(f.secret, f.rt.Key(selection.Slot(i)))
	}
	f.ids.Store(&ids)
	return s, ids[s], nil
}

// routeID returns the opaque id of a registered replica key, or "".
func (f *fleet) routeID(key string) string {
	s, ok := f.rt.Lookup(key)
	if !ok {
		return ""
	}
	if ids := *f.ids.Load(); int(s) < len(ids) {
		return ids[s]
	}
	return ""
}

// routeID is the X-Ramjet-Upstream value of a replica key: the first 8
// bytes of HMAC-SHA256(secret, key), as 16 hex characters. It reveals
// nothing about the address without the secret.
func routeID(secret []byte, key string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(key))
	return hex.EncodeToString(m.Sum(nil)[:8])
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

// Replica is a point-in-time view of one replica of a fleet.
type Replica struct {
	// Key is the replica key: the dial address, plus "#rank" for a
	// data-parallel rank. Internal: never expose it to clients.
	Key string
	// ID is the opaque route id (X-Ramjet-Upstream).
	ID string
	// Slot is the replica's slot in the Router.
	Slot selection.Slot
	// Rank is the data-parallel rank, or -1.
	Rank int
	// Inflight and PendingPrefill are ramjet's live reservations.
	Inflight, PendingPrefill int64
	// Known reports that a live policy's upstream pool lists the replica;
	// Healthy, Available, Fails and Requests are only meaningful then.
	Known     bool
	Healthy   bool
	Available bool
	// Fails is Caddy's passive failure count, Requests its in-flight
	// request count for the dial address.
	Fails, Requests int
	// Profile is the replica's engine profile.
	Profile selection.Profile
}

// replicas returns every replica the fleet knows, by slot. Health comes
// from the upstream pools of the live policies, which are known once a
// policy has routed its first request (Caddy hands the pool to Select
// only).
func (f *fleet) replicas() []Replica {
	n := f.rt.Len()
	ids := *f.ids.Load()
	out := make([]Replica, n)
	for s := range n {
		sl := selection.Slot(s)
		in, pend := f.rt.Load(sl)
		out[s] = Replica{Key: f.rt.Key(sl), Slot: sl, Rank: -1, Inflight: in, PendingPrefill: pend}
		if s < len(ids) {
			out[s].ID = ids[s]
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, v := range f.views {
		for i, up := range v.pool {
			s := v.slots[i]
			if s < 0 || int(s) >= n {
				continue
			}
			r := &out[s]
			r.Known = true
			r.Rank = v.ranks[i]
			r.Profile = v.profiles[i]
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

// poolView caches, for one upstream pool slice, each upstream's replica
// key, slot, rank and opaque id, so that Select does no string work. It is
// rebuilt when Caddy hands Select a different pool (a reload or dynamic
// upstreams).
type poolView struct {
	pool     reverseproxy.UpstreamPool
	keys     []string
	slots    []selection.Slot // -1 when the Router is full
	ranks    []int            // -1 when the dial appears once
	rankHdr  [][]string       // X-data-parallel-rank header value, nil when none
	ids      []string
	idHdr    [][]string // X-Ramjet-Upstream header value (len = cap = 1)
	profiles []selection.Profile
	// untracked: some upstream has no slot (past selection.MaxReplicas).
	untracked bool
}

// same reports whether pool is the pool v was built for.
func (v *poolView) same(pool reverseproxy.UpstreamPool) bool {
	if len(pool) != len(v.pool) {
		return false
	}
	for i := range pool {
		if pool[i] != v.pool[i] {
			return false
		}
	}
	return true
}
