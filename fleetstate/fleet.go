package fleetstate

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

// DefaultStateKey names the fleet state of a policy without state_key.
const DefaultStateKey = "default"

// Fleet is the routing state of one set of replicas: the selection.Router
// (index, registry, live load), the route-id secret and ids, and the
// outlier detector. Safe for concurrent use.
type Fleet struct {
	// StateKey is the state_key of the policies sharing the fleet.
	StateKey string
	// PoolKey is the key the fleet is kept under (PoolKey).
	PoolKey string
	// Created is when the fleet (and its index) was created.
	Created time.Time

	rt *selection.Router

	// mu serialises registration, unregistration (and its hooks), secret
	// and detector changes: a slot freed by Unregister is reused only
	// after everything keyed by it was reset.
	mu     sync.Mutex
	secret []byte
	// ids[slot] is the replica key and opaque route id of each registered
	// replica, under the current secret; replaced (copy on write) on
	// registration and unregistration. An entry whose key is not the
	// replica's (a reused slot) is never returned.
	ids atomic.Pointer[[]slotID]

	// seen[slot] is when a live pool last listed the slot's replica (Unix
	// ns): Register and Depart set it, Depart reads it. Under mu.
	seen [selection.MaxReplicas]int64
	// hooks run on Unregister, under mu (OnUnregister).
	hooks    map[uint64]func(selection.Slot, string)
	hookSeq  uint64
	departed atomic.Uint64

	// tuned is the Router with the knobs of the most recently provisioned
	// policy (sharing rt's index, registry and load): what explain and the
	// dashboard score with.
	tuned atomic.Pointer[selection.Router]

	// outlier is the fleet's outlier detector, replaced when a policy is
	// provisioned with other outlier settings.
	outlier atomic.Pointer[selection.Outlier]
}

// New returns the fleet of stateKey with a new Router for cfg.
func New(stateKey, poolKey string, cfg selection.Config) (*Fleet, error) {
	rt, err := selection.NewRouter(cfg)
	if err != nil {
		return nil, err
	}
	f := &Fleet{StateKey: stateKey, PoolKey: poolKey, rt: rt, Created: time.Now()}
	empty := []slotID{}
	f.ids.Store(&empty)
	f.outlier.Store(selection.NewOutlier(selection.OutlierConfig{}, nil))
	return f, nil
}

// PoolKey is state_key plus a hash of the index shape of the
// configuration (block_tokens, prefix_tokens, chars_per_token,
// index_budget): a change to it starts a new Router (and a cold index);
// other knobs are retuned on the same state.
func PoolKey(stateKey string, cfg selection.Config) string {
	cfg.SetDefaults()
	return SettingsKey("ramjet", stateKey, cfg.IndexShape())
}

// SettingsKey is the key under which a fleet's part (kind: "ramjet-kv",
// "ramjet-engines", ...) of scope (a state_key or a pool key) with these
// settings is kept across config reloads: kind/scope/<hash of the
// settings' JSON>. A reload with the same settings finds the same part;
// any change to them starts a new one.
func SettingsKey(kind, scope string, settings any) string {
	b, _ := json.Marshal(settings)
	return fmt.Sprintf("%s/%s/%016x", kind, scope, xxhash.Sum64(b))
}

// Base returns the Router the fleet was created with (the knobs of its
// first policy); every retuned Router shares its index, registry and load.
func (f *Fleet) Base() *selection.Router { return f.rt }

// Router returns the fleet's routing core, with the knobs of the most
// recently provisioned policy.
func (f *Fleet) Router() *selection.Router {
	if rt := f.tuned.Load(); rt != nil {
		return rt
	}
	return f.rt
}

// Tune returns the Router for cfg, retuning the fleet's in place when cfg
// differs from it (the fleet keeps what it learned), and makes it what
// Router returns.
func (f *Fleet) Tune(cfg selection.Config) (*selection.Router, error) {
	rt := f.rt
	cfg.SetDefaults()
	if cfg != rt.Config() {
		var err error
		if rt, err = f.rt.Retune(cfg); err != nil {
			return nil, err
		}
	}
	f.tuned.Store(rt)
	return rt, nil
}

// TuneOptions is Tune with the rule variants o (selection.Options, e.g.
// the instance spill band of PolicySettings.SpillOptions): the Router
// explain and the dashboard score with applies them too.
func (f *Fleet) TuneOptions(cfg selection.Config, o selection.Options) (*selection.Router, error) {
	rt, err := f.Tune(cfg)
	if err != nil || o == rt.Options() {
		return rt, err
	}
	rt = rt.WithOptions(o)
	f.tuned.Store(rt)
	return rt, nil
}

// Detector returns the fleet's outlier detector.
func (f *Fleet) Detector() *selection.Outlier { return f.outlier.Load() }

// SetOutlier installs a detector with cfg unless the current one has the
// same settings (it then keeps what it learned).
func (f *Fleet) SetOutlier(cfg selection.OutlierConfig) {
	cfg.SetDefaults()
	f.mu.Lock()
	defer f.mu.Unlock()
	if o := f.outlier.Load(); o != nil && o.Config() == cfg {
		return
	}
	f.outlier.Store(selection.NewOutlier(cfg, nil))
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

// SetSecret switches the route-id secret, recomputing every id. An empty
// secret means the process's random one.
func (f *Fleet) SetSecret(secret []byte) {
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
	ids := make([]slotID, n)
	for s := range n {
		if key := f.rt.Key(selection.Slot(s)); key != "" {
			ids[s] = slotID{key: key, id: RouteID(f.secret, key)}
		}
	}
	f.ids.Store(&ids)
}

// Secret returns the current route-id secret.
func (f *Fleet) Secret() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.secret
}

// slotID is a slot's replica key and route id.
type slotID struct{ key, id string }

// Register returns the slot and route id of a replica key, registering it
// when it is new (a slot freed by Unregister is reused first, with a fresh
// id). It counts as the pools listing key now (Depart).
func (f *Fleet) Register(key string) (selection.Slot, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.rt.Register(key)
	if err != nil {
		return -1, "", err
	}
	f.seen[s] = time.Now().UnixNano()
	old := *f.ids.Load()
	if int(s) < len(old) && old[s].key == key {
		return s, old[s].id, nil
	}
	ids := make([]slotID, max(len(old), int(s)+1))
	copy(ids, old)
	ids[s] = slotID{key: key, id: RouteID(f.secret, key)}
	f.ids.Store(&ids)
	return s, ids[s].id, nil
}

// RouteID returns the opaque id of a registered replica key, or "".
func (f *Fleet) RouteID(key string) string {
	s, ok := f.rt.Lookup(key)
	if !ok {
		return ""
	}
	if ids := *f.ids.Load(); int(s) < len(ids) && ids[s].key == key {
		return ids[s].id
	}
	return ""
}

// SlotID returns the opaque id of the replica in slot s, or "" (a free
// slot).
func (f *Fleet) SlotID(s selection.Slot) string {
	if ids := *f.ids.Load(); s >= 0 && int(s) < len(ids) {
		return ids[s].id
	}
	return ""
}

// RouteID is the X-Ramjet-Upstream value of a replica key: the first 8
// bytes of HMAC-SHA256(secret, key), as 16 hex characters. It reveals
// nothing about the address without the secret.
func RouteID(secret []byte, key string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(key))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// ReplicaKeys returns the replica key of every entry of an upstream list,
// as the ramjet policy names replicas: the dial address, or "dial#rank" when
// the address is listed more than once (data-parallel ranks).
func ReplicaKeys(dials []string) []string {
	count := map[string]int{}
	for _, d := range dials {
		count[d]++
	}
	seen := map[string]int{}
	keys := make([]string, len(dials))
	for i, d := range dials {
		rank := -1
		if count[d] > 1 {
			rank = seen[d]
			seen[d]++
		}
		keys[i] = selection.ReplicaKey(d, rank)
	}
	return keys
}

// ReplicaIDs returns the opaque route id of every entry of an upstream list
// under secret.
func ReplicaIDs(secret []byte, dials []string) []string {
	keys := ReplicaKeys(dials)
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = RouteID(secret, k)
	}
	return ids
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
	// Integrity is the engine-integrity state, when configured; nil
	// without it.
	Integrity *IntegrityReport
}

// Replicas returns every slot the fleet has used, by slot, with its
// replica's key, id and live reservations; a slot freed by Unregister has
// Key and ID "" (Snapshot leaves it out). The health fields are left for
// the caller, who knows the upstream pools, to fill.
func (f *Fleet) Replicas() []Replica {
	n := f.rt.Len()
	ids := *f.ids.Load()
	out := make([]Replica, n)
	for s := range n {
		sl := selection.Slot(s)
		in, pend := f.rt.Load(sl)
		out[s] = Replica{Key: f.rt.Key(sl), Slot: sl, Rank: -1, Inflight: in, PendingPrefill: pend}
		if s < len(ids) && ids[s].key == out[s].Key {
			out[s].ID = ids[s].id
		}
	}
	return out
}
