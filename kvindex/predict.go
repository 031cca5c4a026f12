package kvindex

import "time"

// Predicted entries close the blind spot between a routing decision and the
// engine's BlockStored event for it: without them a burst of requests with
// the same new prefix would all see a cold fleet and scatter, and under
// load (a long queue, a long prefill) every request routed since the last
// event would be invisible. The router records the blocks it just sent to a
// replica; they count for that replica's overlap until a BlockStored
// confirms them.
//
// A prediction made with Hold belongs to the requests that made it: it lives
// until its BlockStored arrives, or until grace after the last of those
// requests ends (Release: the engine has computed the prompt by then, so a
// block still unconfirmed was not stored, or its event is in flight), or at
// most its ttl if no request releases it (an upper bound for requests whose
// end is never seen). A prediction made with Predict belongs to no request
// and lives ttl. Config.MaxPredicted bounds them all: past it the oldest are
// dropped before their time, counted by PredictionsDropped.

type predID struct {
	key uint64
	r   Replica
}

// predEntry is one (replica, key) prediction: its expiry and the number of
// requests holding it (Hold, not yet Released).
type predEntry struct {
	exp  int64
	refs int32
}

type predSlot struct {
	id  predID
	exp int64
}

// predRing is a bounded FIFO of expiries. A slot whose entry's expiry
// changed since (extended, or shortened by Release) is stale and ignored
// when popped.
type predRing struct {
	slots []predSlot
	head  int
	count int
}

func (q *predRing) full() bool { return q.count == len(q.slots) }

func (q *predRing) front() *predSlot { return &q.slots[q.head] }

func (q *predRing) push(s predSlot) {
	q.slots[(q.head+q.count)%len(q.slots)] = s
	q.count++
}

func (q *predRing) pop() predSlot {
	s := q.slots[q.head]
	q.head = (q.head + 1) % len(q.slots)
	q.count--
	return s
}

// predictions is the set of predicted (replica, key) entries, guarded by
// Index.mu. Two rings bound them: held carries the ttl expiries of Predict
// and Hold, ended the grace expiries of Release (each ring's expiries are
// nearly in order, so sweeping from the front finds the expired ones).
type predictions struct {
	// ent[r][key] is r's prediction of key (uint64-keyed maps take Go's
	// fast path).
	ent   []map[uint64]predEntry
	bits  map[uint64]set
	held  predRing
	ended predRing
	live  int
	// dropped counts live entries dropped because a ring was full.
	dropped uint64
	// own receives the predictions dropped before their time and those
	// that expired while a request still held them: their blocks, stored
	// later, are still this router's (see ownMem).
	own *ownMem
}

func (p *predictions) init(max int) {
	p.bits = map[uint64]set{}
	p.held.slots = make([]predSlot, max)
	p.ended.slots = make([]predSlot, max)
}

func (p *predictions) entry(r Replica, key uint64) (predEntry, bool) {
	if int(r) >= len(p.ent) {
		return predEntry{}, false
	}
	e, ok := p.ent[r][key]
	return e, ok
}

// push queues s on q, dropping q's oldest slot first when q is full.
func (p *predictions) push(q *predRing, s predSlot, now int64) {
	if q.full() {
		old := q.pop()
		if e, ok := p.entry(old.id.r, old.id.key); ok && e.exp == old.exp {
			if old.exp > now {
				p.dropped++
				p.spill(old.id)
			}
			p.del(old.id)
		}
	}
	q.push(s)
}

// set writes r's prediction of key, creating it when absent.
func (p *predictions) set(id predID, e predEntry) {
	for int(id.r) >= len(p.ent) {
		p.ent = append(p.ent, map[uint64]predEntry{})
	}
	m := p.ent[id.r]
	if _, ok := m[id.key]; !ok {
		p.live++
		s := p.bits[id.key]
		s.add(id.r)
		p.bits[id.key] = s
	}
	m[id.key] = e
}

// spill hands a prediction that leaves before its BlockStored, and that
// some request may still compute, to the own-block memory.
func (p *predictions) spill(id predID) {
	if p.own != nil {
		p.own.add(id)
	}
}

func (p *predictions) del(id predID) {
	delete(p.ent[id.r], id.key)
	p.live--
	s := p.bits[id.key]
	s.del(id.r)
	if s.empty() {
		delete(p.bits, id.key)
	} else {
		p.bits[id.key] = s
	}
}

// predict records r's prediction of key until exp (and, with hold, one
// more request holding it). An entry whose expiry is already past fresh is
// left as it is (a hot prefix costs no ring writes per request).
func (p *predictions) predict(id predID, exp, fresh, now int64, hold bool) {
	e, ok := p.entry(id.r, id.key)
	if hold {
		e.refs++
	}
	if ok && e.exp > fresh {
		p.ent[id.r][id.key] = e
		return
	}
	e.exp = exp
	p.set(id, e)
	p.push(&p.held, predSlot{id, exp}, now)
}

// release drops one request's hold on r's prediction of key; the last one
// shortens its life to exp.
func (p *predictions) release(id predID, exp, now int64) {
	e, ok := p.entry(id.r, id.key)
	if !ok || e.refs <= 0 {
		return
	}
	e.refs--
	if e.refs > 0 || e.exp <= exp {
		p.ent[id.r][id.key] = e
		return
	}
	e.exp = exp
	p.ent[id.r][id.key] = e
	p.push(&p.ended, predSlot{id, exp}, now)
}

// confirm drops the prediction that r holds key: the engine reported it.
// It reports whether there was one.
func (p *predictions) confirm(r Replica, key uint64) bool {
	if p.live == 0 {
		return false
	}
	if _, ok := p.entry(r, key); ok {
		p.del(predID{key, r})
		return true
	}
	return false
}

func (p *predictions) dropReplica(r Replica) {
	if int(r) >= len(p.ent) {
		return
	}
	for key := range p.ent[r] {
		p.del(predID{key, r})
	}
}

// sweep pops expired slots from the front of both rings. Expiries vary a
// little, so a later slot may expire first; holders checks expiry, and the
// ring bound caps the rest.
func (p *predictions) sweep(now time.Time) {
	t := now.UnixNano()
	for _, q := range []*predRing{&p.held, &p.ended} {
		for q.count > 0 && q.front().exp <= t {
			s := q.pop()
			if e, ok := p.entry(s.id.r, s.id.key); ok && e.exp == s.exp {
				if e.refs > 0 {
					p.spill(s.id)
				}
				p.del(s.id)
			}
		}
	}
}

// holders returns the members of cand with a live prediction for key.
func (p *predictions) holders(key uint64, cand set, now int64) set {
	s, ok := p.bits[key]
	if !ok {
		return set{}
	}
	s = s.and(cand)
	var out set
	s.each(func(r Replica) {
		if e, _ := p.entry(r, key); e.exp > now {
			out.add(r)
		}
	})
	return out
}

// Predict records that r was just sent a request whose block keys are keys:
// until each is confirmed by a BlockStored event or ttl passes, it counts
// for r's overlap. Keys r already holds are not recorded, and keys predicted
// within the last half ttl are not extended (so a hot prefix costs no
// writes per request; it expires at most ttl/2 early).
func (x *Index) Predict(r Replica, keys []uint64, ttl time.Duration) {
	x.predict(r, keys, ttl, false)
}

// Hold is Predict on behalf of one request: the predictions live until
// their BlockStored arrives or until Release for that request (plus its
// grace), at most ttl. Every Hold must be followed by one Release with
// the same keys when the request ends.
func (x *Index) Hold(r Replica, keys []uint64, ttl time.Duration) {
	x.predict(r, keys, ttl, true)
}

func (x *Index) predict(r Replica, keys []uint64, ttl time.Duration, hold bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	now := x.cfg.Now()
	x.pred.sweep(now)
	t := now.UnixNano()
	exp := now.Add(ttl).UnixNano()
	fresh := exp - int64(ttl/2) // a prediction expiring after this is recent enough
	var refs map[uint64]int32
	if int(r) < len(x.reps) {
		refs = x.reps[r].refs
	}
	for _, k := range keys {
		if hold && x.fly.on {
			x.fly.hold(predID{k, r}, exp, t, int64(ttl))
		}
		if s := x.keys[k]; s.has(r) {
			if v := refs[k]; v&ownRef == 0 {
				refs[k] = v | ownRef // routed here while held: the estimate learned it
			}
			continue
		}
		x.pred.predict(predID{k, r}, exp, fresh, t, hold)
	}
}

// Release ends one request's Hold of keys on r: a prediction no other
// request holds expires grace from now unless its BlockStored arrives
// first. Keys that were confirmed, expired or never held are skipped. A
// prediction dropped and made again by another request since that
// request's Hold loses that request's hold early (it then lives grace).
func (x *Index) Release(r Replica, keys []uint64, grace time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.fly.ent) > 0 {
		for _, k := range keys {
			x.fly.release(predID{k, r})
		}
	}
	if x.pred.live == 0 {
		return
	}
	now := x.cfg.Now()
	x.pred.sweep(now)
	t := now.UnixNano()
	exp := now.Add(grace).UnixNano()
	for _, k := range keys {
		x.pred.release(predID{k, r}, exp, t)
	}
}

// Predicted is the number of live predicted entries (expired ones are
// swept first).
func (x *Index) Predicted() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pred.sweep(x.cfg.Now())
	return x.pred.live
}

// OwnRemembered is the number of (replica, block) pairs remembered as this
// router's own after the index lost them (at most Config.MaxOwnGone).
func (x *Index) OwnRemembered() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.own.at)
}

// PredictionsDropped counts predicted entries dropped before their time
// because Config.MaxPredicted were live.
func (x *Index) PredictionsDropped() uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.pred.dropped
}
