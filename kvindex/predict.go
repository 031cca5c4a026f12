package kvindex

import "time"

// Predicted entries close the blind spot between a routing decision and the
// engine's BlockStored event for it: without them a burst of requests with
// the same new prefix would all see a cold fleet and scatter. The router
// records the blocks it just sent to a replica with Predict; they count for
// that replica's overlap until a BlockStored confirms them or they expire.

type predID struct {
	key uint64
	r   Replica
}

type predSlot struct {
	id  predID
	exp int64
}

// predictions is a bounded FIFO of predicted (replica, key) entries with
// their expiry, guarded by Index.mu.
type predictions struct {
	// exp[r][key] is the expiry of r's prediction of key (uint64-keyed
	// maps take Go's fast path).
	exp   []map[uint64]int64
	bits  map[uint64]set
	ring  []predSlot
	head  int
	count int
	live  int
}

func (p *predictions) init(max int) {
	p.bits = map[uint64]set{}
	p.ring = make([]predSlot, max)
}

func (p *predictions) add(id predID, exp int64) {
	if p.count == len(p.ring) {
		p.pop()
	}
	p.ring[(p.head+p.count)%len(p.ring)] = predSlot{id, exp}
	p.count++
	for int(id.r) >= len(p.exp) {
		p.exp = append(p.exp, map[uint64]int64{})
	}
	m := p.exp[id.r]
	if _, ok := m[id.key]; !ok {
		p.live++
		s := p.bits[id.key]
		s.add(id.r)
		p.bits[id.key] = s
	}
	m[id.key] = exp
}

// expiry returns the expiry of r's prediction of key.
func (p *predictions) expiry(r Replica, key uint64) (int64, bool) {
	if int(r) >= len(p.exp) {
		return 0, false
	}
	e, ok := p.exp[r][key]
	return e, ok
}

// pop removes the oldest ring slot, and its entry unless a later Predict
// extended it.
func (p *predictions) pop() {
	sl := p.ring[p.head]
	p.head = (p.head + 1) % len(p.ring)
	p.count--
	if e, ok := p.expiry(sl.id.r, sl.id.key); ok && e == sl.exp {
		p.del(sl.id)
	}
}

func (p *predictions) del(id predID) {
	delete(p.exp[id.r], id.key)
	p.live--
	s := p.bits[id.key]
	s.del(id.r)
	if s.empty() {
		delete(p.bits, id.key)
	} else {
		p.bits[id.key] = s
	}
}

// confirm drops the prediction that r holds key: the engine reported it.
func (p *predictions) confirm(r Replica, key uint64) {
	if p.live == 0 {
		return
	}
	if _, ok := p.expiry(r, key); ok {
		p.del(predID{key, r})
	}
}

func (p *predictions) dropReplica(r Replica) {
	if int(r) >= len(p.exp) {
		return
	}
	for key := range p.exp[r] {
		p.del(predID{key, r})
	}
}

// sweep pops expired slots from the front. TTLs vary, so a later slot may
// expire first; holders checks expiry, and the ring bound caps the rest.
func (p *predictions) sweep(x *Index, now time.Time) {
	t := now.UnixNano()
	for p.count > 0 && p.ring[p.head].exp <= t {
		p.pop()
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
		if e, _ := p.expiry(r, key); e > now {
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
	x.mu.Lock()
	defer x.mu.Unlock()
	now := x.cfg.Now()
	x.pred.sweep(x, now)
	exp := now.Add(ttl).UnixNano()
	fresh := exp - int64(ttl/2) // a prediction expiring after this is recent enough
	for _, k := range keys {
		if s := x.keys[k]; s.has(r) {
			continue
		}
		if e, ok := x.pred.expiry(r, k); ok && e > fresh {
			continue // predicted within the last half TTL: keep it as is
		}
		x.pred.add(predID{k, r}, exp)
	}
}

// Predicted is the number of live predicted entries.
func (x *Index) Predicted() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.pred.live
}
