package fleetstate

import (
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// DefaultDepartAfter is how long a replica must be missing from every live
// upstream pool, with no request in flight on it, before Depart forgets it:
// long enough that a DNS answer missing a pod for a refresh or two (or a
// reload that lists it again) keeps its warm index.
const DefaultDepartAfter = 30 * time.Second

// Unregister forgets the replica named key: it left the fleet. Its slot's
// index entries, load, capacity and external load (selection.Router.Unregister),
// route id and outlier state are dropped, and every OnUnregister hook
// runs, before the slot can be reused: the next replica registered in it
// starts cold. It reports whether key was registered.
//
// Requests still holding a reservation on the slot release into nothing
// (their load was dropped); Depart never unregisters a slot while one does
// (selection.Router.UnregisterIdle).
func (f *Fleet) Unregister(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unregister(key, false)
}

// unregister is Unregister with f.mu held; idle: only while no request
// holds a reservation on the slot (selection.Router.UnregisterIdle).
func (f *Fleet) unregister(key string, idle bool) bool {
	s, ok := f.rt.Lookup(key)
	if !ok {
		return false
	}
	if idle && !f.rt.UnregisterIdle(key) || !idle && !f.rt.Unregister(key) {
		return false
	}
	if old := *f.ids.Load(); int(s) < len(old) {
		ids := append([]slotID(nil), old...)
		ids[s] = slotID{}
		f.ids.Store(&ids)
	}
	f.seen[s] = 0
	f.outlier.Load().Forget(s)
	for _, fn := range f.hooks {
		fn(s, key)
	}
	f.departed.Add(1)
	return true
}

// OnUnregister adds fn to what Unregister runs for a departed replica (its
// slot and key), so that state other packages keep per slot is reset
// before the slot is reused. fn runs with the fleet's lock held: it must
// not call the Fleet's Register, Unregister, Depart, SetSecret, Secret or
// SetOutlier. The returned func removes the hook.
func (f *Fleet) OnUnregister(fn func(s selection.Slot, key string)) (remove func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hooks == nil {
		f.hooks = make(map[uint64]func(selection.Slot, string))
	}
	f.hookSeq++
	id := f.hookSeq
	f.hooks[id] = fn
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.hooks, id)
	}
}

// Depart unregisters the replicas that left the fleet: every registered
// replica that listed does not report (no live upstream pool lists it) and
// that no pool has listed for grace, as of now, provided no request holds a
// reservation on it (it departs at a later call, once its requests ended).
// Replicas that listed reports are marked seen at now. It returns the keys
// it unregistered, nil when none.
//
// Call it periodically with the union of the live pools; a replica is also
// seen when it is registered, so that a pool being built (registered, not
// yet published) is not swept.
func (f *Fleet) Depart(listed func(key string) bool, now time.Time, grace time.Duration) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var gone []string
	at := now.UnixNano()
	for s := range f.rt.Len() {
		sl := selection.Slot(s)
		key := f.rt.Key(sl)
		if key == "" {
			continue
		}
		if listed(key) {
			f.seen[s] = at
			continue
		}
		if at-f.seen[s] < int64(grace) {
			continue
		}
		// A request may take a reservation at any moment: the check
		// that none holds one is made in the same atomic step as the
		// departure (a check before it would race with Reserve).
		if f.unregister(key, true) {
			gone = append(gone, key)
		}
	}
	return gone
}

// Departures counts the replicas Unregister and Depart forgot.
func (f *Fleet) Departures() uint64 { return f.departed.Load() }
