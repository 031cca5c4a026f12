package selection

import "sync/atomic"

// maxExternalRequests and maxExternalKV bound what SetExternalLoad
// stores, so that load(r) cannot overflow whatever an engine reports.
const (
	maxExternalRequests = 1 << 30
	maxExternalKV       = 1 << 50
)

// mirrorOne is the fixed-point unit of SetExternalMirror's ratio, and
// maxMirror the largest ratio stored (others per own request).
const (
	mirrorOne = 1 << 10
	maxMirror = 1 << 20
)

// extCell is a replica's engine-reported load that this instance did not
// reserve (other routers' requests, traffic sent to the engine directly),
// as of the last scrape. It lives in the replica's loadCell, on the same
// cache line as the local load that Pick reads with it: each word packs
// two figures so that the cell stays 64 bytes.
type extCell struct {
	reqs   atomic.Uint64 // running + waiting (high 32 bits), waiting (low 32)
	kv     atomic.Int64  // KV tokens used
	mirror atomic.Int64  // SetExternalMirror's ratio x mirrorOne (high 32), own in-flight at SetExternalLoad (low 32)
}

// SetExternalLoad sets the load on slot s that this instance did not
// reserve, as the replica's engine reports it net of this instance's own
// requests (enginemetrics.Fuse): running and waiting requests, and KV
// tokens used. Zeros mean none (no fresh scrape: local reservations
// only). The figures replace the previous ones; they count in load(r) as
// local reservations do until the next call:
//
//	load(r) = (inflight + running + waiting + mirror) x request_cost + pending prefill
//	          + context_weight x (resident + kvUsedTokens)^2 / kv_capacity
//
// (mirror: SetExternalMirror). It also takes this instance's in-flight
// requests on s now as the mirror's base. Negative figures count as
// zero. It does not allocate and is safe to call concurrently with Pick
// and Route; Unregister resets it.
func (rt *Router) SetExternalLoad(s Slot, running, waiting, kvUsedTokens int64) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	running = min(max(running, 0), maxExternalRequests)
	waiting = min(max(waiting, 0), maxExternalRequests)
	c := &rt.loads[s]
	c.ext.reqs.Store(uint64(running+waiting)<<32 | uint64(waiting))
	c.ext.kv.Store(min(max(kvUsedTokens, 0), maxExternalKV))
	base := min(max(c.inflight.Load(), 0), maxExternalRequests)
	for {
		old := c.ext.mirror.Load()
		if c.ext.mirror.CompareAndSwap(old, old&^(1<<32-1)|base) {
			return
		}
	}
}

// SetExternalMirror sets how many requests of other instances slot s is
// assumed to receive, until the next scrape, per request this instance's
// in-flight count on s grew by since SetExternalLoad (negative growth: as
// many fewer, the external count not falling below zero). Several ramjet
// instances behind one front see the same engines and run the same rule,
// so between two scrapes the others mostly do what this one does: a
// replica that all find idle at a scrape fills N times as fast as one
// instance's reservations show, and one that drains drains N times as
// fast. The caller measures the ratio as the others' requests per own
// one over the fleet at the scrape (N-1 with N instances behind an even
// front; 0, the default, for a lone instance: no mirror). Negative ratios
// count as zero, ratios past 1024 as 1024.
func (rt *Router) SetExternalMirror(s Slot, othersPerOwn float64) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	m := int64(0)
	if othersPerOwn > 0 {
		m = int64(min(othersPerOwn, maxMirror/mirrorOne) * mirrorOne)
	}
	c := &rt.loads[s]
	for {
		old := c.ext.mirror.Load()
		if c.ext.mirror.CompareAndSwap(old, m<<32|old&(1<<32-1)) {
			return
		}
	}
}

// ExternalLoad returns slot s's external load as last set by
// SetExternalLoad (zeros: none).
func (rt *Router) ExternalLoad(s Slot) (running, waiting, kvUsedTokens int64) {
	if s < 0 || s >= MaxReplicas {
		return 0, 0, 0
	}
	e := &rt.loads[s].ext
	p := e.reqs.Load()
	req, w := int64(p>>32), int64(p&(1<<32-1))
	return max(req-w, 0), w, e.kv.Load()
}

// ExternalRequests is slot s's external requests as load(r) counts them
// now: SetExternalLoad's running and waiting, plus the mirror of this
// instance's in-flight growth since (SetExternalMirror).
func (rt *Router) ExternalRequests(s Slot) int64 {
	if s < 0 || s >= MaxReplicas {
		return 0
	}
	return rt.loads[s].extRequests()
}

// extRequests is the cell's external running + waiting requests, with
// the mirror of this instance's in-flight growth since the scrape.
func (c *loadCell) extRequests() int64 {
	n := int64(c.ext.reqs.Load() >> 32)
	if m := c.ext.mirror.Load(); m>>32 != 0 {
		grown := c.inflight.Load() - m&(1<<32-1)
		n = max(n+grown*(m>>32)/mirrorOne, 0)
	}
	return n
}

// extKV is slot s's external KV tokens used.
func (c *loadCell) extKV() int64 { return c.ext.kv.Load() }

// resetExternal drops slot s's external load (Unregister).
func (c *loadCell) resetExternal() {
	c.ext.reqs.Store(0)
	c.ext.kv.Store(0)
	c.ext.mirror.Store(0)
}
