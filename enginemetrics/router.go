package enginemetrics

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// RouterFeed connects a Scraper to a fleet's selection.Router: Local (the
// Scraper's Config.Local) reads the router's reservations, Push (its
// Config.OnSnapshot) hands each new snapshot to the router. The router is
// set with Set (the fleet provisioned last); without one both do nothing.
// Safe for concurrent use.
type RouterFeed struct {
	rt atomic.Pointer[selection.Router]
}

// Set points the feed at rt.
func (f *RouterFeed) Set(rt *selection.Router) { f.rt.Store(rt) }

// Local is this instance's reservations on the replica named key.
func (f *RouterFeed) Local(key string) Local {
	rt := f.rt.Load()
	if rt == nil {
		return Local{}
	}
	s, ok := rt.Lookup(key)
	if !ok {
		return Local{}
	}
	in, pend := rt.Load(s)
	return Local{Inflight: in, PendingPrefill: pend, ResidentTokens: rt.Resident(s)}
}

// Push hands a replica's new snapshot to the router: the load that this
// instance did not reserve (Fuse; zeros when stale, so that routing falls
// back to local reservations) and the engine's KV capacity, when it
// reports one.
func (f *RouterFeed) Push(sn Snapshot) {
	rt := f.rt.Load()
	if rt == nil {
		return
	}
	s, ok := rt.Lookup(sn.Key)
	if !ok {
		return
	}
	ext := Fuse(sn, time.Now())
	ext.Apply(rt, s)
	if c := ext.KVCapacityTokens; c > 0 {
		// The index applies whole blocks; set it only when it changed.
		bt := int64(rt.Config().BlockTokens)
		if max(1, c/bt)*bt != rt.Capacity(s) {
			rt.SetCapacity(s, c)
		}
	}
}

// Apply hands e to slot s of rt (selection.Router.SetExternalLoad): the
// other instances' running and waiting requests count in load(r) as this
// instance's own reservations do; their KV tokens (e.KVUsedTokens) do not.
// The engine's KV usage is in the engine's units (a prefix shared by many
// requests held once, outputs included), this instance's resident context
// in the router's (every in-flight request's whole prompt), so with
// several instances the difference is not the others' context in the
// router's units: it made a replica warm with one shared prefix look
// loaded to every instance at once, and each one's spill off it a new
// cold copy (fleet simulation, shared-prefix with 4 instances on the
// precise path: TTFT p99 1.80x one instance's with the KV figure, 1.04x
// without; bench/RESULTS.md, "Several instances, engine load without the
// engines' KV figure"). The KV figure stays in the snapshot (ops JSON).
// The engine's whole KV usage (e.KVHeld, -1: none) goes to SetEngineKV,
// which only selection.Options.EngineOverflow reads; e.Fresh to
// SetExternalFresh (a stale replica gets the others'-queues prior of the
// precise path, as without engine_metrics).
func (e External) Apply(rt *selection.Router, s selection.Slot) {
	rt.SetExternalLoad(s, e.Running, e.Waiting, 0)
	rt.SetExternalFresh(s, e.Fresh)
	rt.SetEngineKV(s, e.KVHeld)
}

// DialReplica is one routed replica and the dial address of its engine.
type DialReplica struct {
	Dial string
	ReplicaRef
}

// TargetsFor groups replicas by engine: one target per dial address (its
// metrics at scheme://dial+path), sorted by dial; a dial listed once is
// one replica (the whole engine), listed k times k data-parallel ranks.
// A replica key listed twice counts once.
func TargetsFor(scheme, path string, reps []DialReplica) []Target {
	byDial := map[string][]ReplicaRef{}
	seen := map[string]bool{}
	for _, r := range reps {
		if seen[r.Key] {
			continue
		}
		seen[r.Key] = true
		byDial[r.Dial] = append(byDial[r.Dial], r.ReplicaRef)
	}
	dials := make([]string, 0, len(byDial))
	for d := range byDial {
		dials = append(dials, d)
	}
	sort.Strings(dials)
	ts := make([]Target, 0, len(dials))
	for _, d := range dials {
		ts = append(ts, Target{URL: scheme + "://" + d + path, Replicas: byDial[d]})
	}
	return ts
}
