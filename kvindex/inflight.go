package kvindex

// inflight is the set of (replica, router key) pairs of this router's
// requests in flight: every block key of a request Hold made (its whole
// chain, the blocks the replica held at the decision too), counted once per
// request holding it, until Release for the last of them, or at most the
// Hold's ttl. A stored run's blocks in it are this router's requests' own,
// whatever else the run looks like: a preempted request recomputing its
// evicted blocks, one whose cached prefix the engine evicted while it
// queued (ForeignPrefill.StoredOwn counts them as own). Unlike the ownRef
// marks, which stay with a block after its request ended, it tells this
// router's requests from other instances' requests that recompute the same
// context later.
//
// Kept only while an estimate of the others' prefill asks for it
// (Precise.SetForeign with selection.ForeignPrefill.OwnInflight). Bounded by
// Config.MaxInflight pairs: once full, the pairs past their ttl are swept
// (at most once per ttl/8), and a Hold's new pairs that still do not fit
// are not recorded (InflightDropped counts them). Guarded by Index.mu.
type inflight struct {
	on      bool
	ent     map[predID]predEntry // refs: requests holding it; exp: the last Hold's ttl
	max     int
	scan    int64 // no sweep before this (Unix nanoseconds)
	dropped uint64
}

func (f *inflight) init(max int) {
	f.ent = make(map[predID]predEntry)
	f.max = max
}

// hold adds one request's hold of id until exp (its ttl); a full set is
// swept first, at most once per ttl/8.
func (f *inflight) hold(id predID, exp, now int64, ttl int64) {
	if !f.on {
		return
	}
	e, ok := f.ent[id]
	if !ok && len(f.ent) >= f.max {
		if now >= f.scan {
			f.scan = now + ttl/8
			for k, v := range f.ent {
				if v.exp <= now {
					delete(f.ent, k)
				}
			}
		}
		if len(f.ent) >= f.max {
			f.dropped++
			return
		}
	}
	e.refs++
	e.exp = max(e.exp, exp)
	f.ent[id] = e
}

// release drops one request's hold of id: the last one's pair is gone.
func (f *inflight) release(id predID) {
	e, ok := f.ent[id]
	if !ok {
		return
	}
	if e.refs--; e.refs <= 0 {
		delete(f.ent, id)
		return
	}
	f.ent[id] = e
}

// has reports whether a request of this router holds id at now.
func (f *inflight) has(id predID, now int64) bool {
	if len(f.ent) == 0 {
		return false
	}
	e, ok := f.ent[id]
	return ok && e.exp > now
}

func (f *inflight) dropReplica(r Replica) {
	for id := range f.ent {
		if id.r == r {
			delete(f.ent, id)
		}
	}
}

// trackInflight turns the set on or off (and empties it).
func (x *Index) trackInflight(on bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.fly.on = on
	clear(x.fly.ent)
}

// Inflight is the number of (replica, block) pairs of this router's
// requests in flight (at most Config.MaxInflight; those past their ttl
// included until swept).
func (x *Index) Inflight() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.fly.ent)
}

// InflightDropped counts the (replica, block) pairs of requests in flight
// not recorded because Config.MaxInflight were.
func (x *Index) InflightDropped() uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.fly.dropped
}
