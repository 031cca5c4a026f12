package selection

import "sync/atomic"

// maxExternalRequests and maxExternalKV bound what SetExternalLoad
// stores, so that load(r) cannot overflow whatever an engine reports.
const (
	maxExternalRequests = 1 << 30
	maxExternalKV       = 1 << 50
)

// extCell is a replica's engine-reported load that this instance did not
// reserve (other routers' requests, traffic sent to the engine directly),
// as of the last scrape. It lives in the replica's loadCell, on the same
// cache line as the local load that Pick reads with it.
type extCell struct {
	requests atomic.Int64 // running + waiting
	waiting  atomic.Int64
	kv       atomic.Int64 // KV tokens used
}

// SetExternalLoad sets the load on slot s that this instance did not
// reserve, as the replica's engine reports it net of this instance's own
// requests (enginemetrics.Fuse): running and waiting requests, and KV
// tokens used. Zeros mean none (no fresh scrape: local reservations
// only). The figures replace the previous ones; they count in load(r) as
// local reservations do until the next call:
//
//	load(r) = (inflight + running + waiting) x request_cost + pending prefill
//	          + context_weight x (resident + kvUsedTokens)^2 / kv_capacity
//
// Negative figures count as zero. It does not allocate and is safe to
// call concurrently with Pick and Route; Unregister resets it.
func (rt *Router) SetExternalLoad(s Slot, running, waiting, kvUsedTokens int64) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	running = min(max(running, 0), maxExternalRequests)
	waiting = min(max(waiting, 0), maxExternalRequests)
	e := &rt.loads[s].ext
	e.waiting.Store(waiting)
	e.requests.Store(running + waiting)
	e.kv.Store(min(max(kvUsedTokens, 0), maxExternalKV))
}

// ExternalLoad returns slot s's external load as last set by
// SetExternalLoad (zeros: none).
func (rt *Router) ExternalLoad(s Slot) (running, waiting, kvUsedTokens int64) {
	if s < 0 || s >= MaxReplicas {
		return 0, 0, 0
	}
	e := &rt.loads[s].ext
	req, w := e.requests.Load(), e.waiting.Load()
	return max(req-w, 0), w, e.kv.Load()
}

// extRequests is slot s's external running + waiting requests.
func (c *loadCell) extRequests() int64 { return c.ext.requests.Load() }

// extKV is slot s's external KV tokens used.
func (c *loadCell) extKV() int64 { return c.ext.kv.Load() }

// resetExternal drops slot s's external load (Unregister).
func (c *loadCell) resetExternal() {
	c.ext.requests.Store(0)
	c.ext.waiting.Store(0)
	c.ext.kv.Store(0)
}
