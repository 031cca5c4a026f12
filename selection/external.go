package selection

import "sync/atomic"

// maxExternalRequests and maxExternalKV bound what SetExternalLoad
// stores, so that load(r) cannot overflow whatever an engine reports.
const (
	maxExternalRequests = 1 << 30
	maxExternalKV       = 1 << 50
	maxExternalPrefill  = 1 << 30
)

// extCell is a replica's engine-reported load that this instance did not
// reserve (other routers' requests, traffic sent to the engine directly),
// as of the last scrape. It lives in the replica's loadCell, on the same
// cache line as the local load that Pick reads with it.
type extCell struct {
	requests atomic.Int64 // running + waiting
	waiting  atomic.Int32 // at most maxExternalRequests
	prefill  atomic.Int32 // others' prefill tokens (SetExternalPrefill), at most maxExternalPrefill
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
// Negative figures count as zero. The KV tokens are the engine's (real)
// tokens, stored in the index's at the applied density (RealTokens). It does
// not allocate and is safe to call concurrently with Pick and Route;
// Unregister resets it.
func (rt *Router) SetExternalLoad(s Slot, running, waiting, kvUsedTokens int64) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	running = min(max(running, 0), maxExternalRequests)
	waiting = min(max(waiting, 0), maxExternalRequests)
	e := &rt.loads[s].ext
	if running+waiting > 0 {
		rt.sawOthers()
		if !rt.engOthers.Load() {
			rt.engOthers.Store(true)
		}
	}
	rt.qSum.Add(waiting - int64(e.waiting.Swap(int32(waiting))))
	e.requests.Store(running + waiting)
	e.kv.Store(min(rt.RealTokens(min(max(kvUsedTokens, 0), maxExternalKV)), maxExternalKV))
}

// SetExternalFresh records whether slot s's engine-reported load
// (SetExternalLoad) comes from a fresh scrape. While it does, the engine's
// queue already counts the other instances' queued requests, and
// ForeignPrefill's prior (SetPrior) leaves the slot alone; a slot with no
// fresh scrape (engine_metrics off, none yet, or stale: SetExternalLoad's
// zeros) gets the prior, as without engine_metrics. Unregister resets it.
func (rt *Router) SetExternalFresh(s Slot, fresh bool) {
	if s >= 0 && s < MaxReplicas && rt.extFresh[s].Load() != fresh {
		rt.extFresh[s].Store(fresh)
	}
}

// ExternalFresh reports SetExternalFresh's last value for slot s.
func (rt *Router) ExternalFresh(s Slot) bool {
	return s >= 0 && s < MaxReplicas && rt.extFresh[s].Load()
}

// ExternalLoad returns slot s's external load as last set by
// SetExternalLoad (zeros: none).
func (rt *Router) ExternalLoad(s Slot) (running, waiting, kvUsedTokens int64) {
	if s < 0 || s >= MaxReplicas {
		return 0, 0, 0
	}
	e := &rt.loads[s].ext
	req, w := e.requests.Load(), int64(e.waiting.Load())
	return max(req-w, 0), w, e.kv.Load()
}

// SetExternalPrefill sets the prompt tokens that other routers' requests
// are believed to have pending on slot s (ForeignPrefill's estimate from
// the engine's KV events). They count in load(r) as this instance's own
// pending prefill does, until the next call; 0 means none. Negative
// figures count as zero; tokens are the engine's (real) ones, stored in
// the index's at the applied density (RealTokens). It does not allocate and is safe to call
// concurrently with Pick; Unregister resets it.
func (rt *Router) SetExternalPrefill(s Slot, tokens int64) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	rt.loads[s].ext.prefill.Store(int32(min(rt.RealTokens(min(max(tokens, 0), maxExternalPrefill)), maxExternalPrefill)))
}

// SawOthers reports whether this instance has seen load it did not
// reserve (SetExternalLoad above zero), other instances' stored runs in
// the KV feeds (ForeignPrefill, from ForeignEvidenceShare of this
// instance's own on, since ever or within EvidenceWindow), or answers showing other instances' placements
// (Several). SetExternalPrefill and SetExternalContext alone are not
// evidence: a lone instance misreads a few of its own runs as foreign.
func (rt *Router) SawOthers() bool { return rt.others.Load() || rt.Several() }

func (rt *Router) sawOthers() {
	if !rt.others.Load() {
		rt.others.Store(true)
	}
}

// ExternalPrefill returns slot s's external pending prefill as last set
// by SetExternalPrefill.
func (rt *Router) ExternalPrefill(s Slot) int64 {
	if s < 0 || s >= MaxReplicas {
		return 0
	}
	return int64(rt.loads[s].ext.prefill.Load())
}

// SetExternalContext sets the context tokens that other routers'
// requests are believed to keep resident on slot s (ForeignPrefill's
// estimate from their stored runs, ResidentLives). They count in load(r)'s
// context and pair terms as this instance's in-flight requests' contexts
// do, unless SetExternalLoad's engine-reported KV tokens are larger (the
// same contexts, measured: the larger of the two counts), and not for a
// prompt whose prefix no replica holds (rendezvous placement decides
// there, alike on every instance). 0 means none; negative figures count
// as zero; tokens are real ones, stored as SetExternalPrefill's. It does
// not allocate; Unregister resets it.
func (rt *Router) SetExternalContext(s Slot, tokens int64) {
	if s < 0 || s >= MaxReplicas {
		return
	}
	rt.loads[s].extCtx.Store(int32(min(rt.RealTokens(min(max(tokens, 0), maxExternalPrefill)), maxExternalPrefill)))
}

// ExternalContext returns slot s's external context as last set by
// SetExternalContext.
func (rt *Router) ExternalContext(s Slot) int64 {
	if s < 0 || s >= MaxReplicas {
		return 0
	}
	return int64(rt.loads[s].extCtx.Load())
}

// extPrefill is slot s's external pending prefill tokens.
func (c *loadCell) extPrefill() int64 { return int64(c.ext.prefill.Load()) }

// extRequests is slot s's external running + waiting requests.
func (c *loadCell) extRequests() int64 { return c.ext.requests.Load() }

// extKV is slot s's external KV tokens used.
func (c *loadCell) extKV() int64 { return c.ext.kv.Load() }

// resetExternal drops slot s's external load (Unregister).
func (c *loadCell) resetExternal() {
	c.ext.requests.Store(0)
	c.ext.waiting.Store(0)
	c.ext.prefill.Store(0)
	c.ext.kv.Store(0)
	c.extCtx.Store(0)
}

// DepthsWith is Depths with s's working memory (an annotator's own
// Scratch, not one a Pick is using): it does not allocate once s has grown
// to the fleet.
func (x *Index) DepthsWith(blocks []uint64, interest *SlotSet, depth *[MaxReplicas]int32, s *Scratch) {
	x.depths(blocks, interest[:], depth[:], &s.work)
}
