package enginemetrics

import (
	"math"
	"time"
)

// External is the load on a replica that this ramjet instance did not
// reserve, as of the last good scrape: other instances' requests (and
// anything sent to the engine around ramjet). It is what the routing core
// adds to its own live reservations:
//
//	load(r) = (inflight + ext.Running + ext.Waiting) x request_cost + pending + resident
//
// and it is zero (Fresh false) when the replica has no usable scrape, so
// that routing falls back to local reservations only.
type External struct {
	// Running and Waiting are requests on the engine beyond this
	// instance's in-flight reservations at the scrape, split between the
	// running batch and the queue in the engine's proportion.
	Running int64 `json:"running"`
	Waiting int64 `json:"waiting"`
	// KVUsedTokens is the engine's used KV tokens minus the resident
	// tokens this instance reported (Local.ResidentTokens; with 0 it is
	// the engine's whole usage, this instance's share included).
	KVUsedTokens int64 `json:"kv_used_tokens"`
	// KVCapacityTokens is the engine's KV capacity in tokens (0:
	// unknown). It is kept from the last good scrape even when stale:
	// capacity is configuration, not load.
	KVCapacityTokens int64 `json:"kv_capacity_tokens"`
	// KVHeld is the engine's whole KV usage in tokens (this instance's
	// requests included), -1 when stale or unreported: what
	// selection.Options.EngineOverflow reads (Router.SetEngineKV).
	KVHeld int64 `json:"-"`
	// KVUsage is the engine's whole KV usage in [0,1] (0 when stale).
	KVUsage float64 `json:"kv_usage"`
	// Fresh is false when the figures above (but capacity) are zero
	// because the replica has no good scrape within StaleAfter.
	Fresh bool `json:"fresh"`
	// Age is how old the scrape is at the time of fusion.
	Age time.Duration `json:"age_ns"`
}

// Fuse returns the external load of a replica at now from its last
// snapshot. The engine's own counts at the scrape include this instance's
// requests that had reached it; subtracting this instance's in-flight
// reservations around the scrape (the larger of before and after, so that
// a burst of its own during the scrape is not taken for someone else's)
// leaves everyone else's. The caller adds its live reservations of now,
// which carry every request it sent since the scrape: neither a burst
// (the metrics lag) nor other instances' traffic (reservations are local)
// is invisible, and nothing is counted twice beyond one scrape interval.
//
// Requests of this instance that the engine already finished but whose
// reservation is still held (the tail of a stream) make the subtraction
// undercount others by as many, never overcount: the result is clamped at
// zero.
func Fuse(s Snapshot, now time.Time) External {
	e := External{KVCapacityTokens: s.Metrics.KVCapacityTokens, KVHeld: -1}
	if !s.Fresh(now) {
		return e
	}
	e.Fresh, e.Age = true, now.Sub(s.ScrapedAt)
	m := s.Metrics
	engine := m.Running + m.Waiting
	others := max(engine-s.Local.Inflight, 0)
	if others > 0 && engine > 0 {
		e.Waiting = int64(math.Round(float64(others) * float64(m.Waiting) / float64(engine)))
		e.Running = others - e.Waiting
	}
	e.KVUsedTokens = max(m.KVUsedTokens-s.Local.ResidentTokens, 0)
	if (m.HasKVUsage && m.KVCapacityTokens > 0) || m.KVUsedTokens > 0 {
		e.KVHeld = m.KVUsedTokens
	}
	if m.HasKVUsage {
		e.KVUsage = m.KVUsage
	}
	return e
}

// Requests is the external requests, running and waiting.
func (e External) Requests() int64 { return e.Running + e.Waiting }

// LoadTokens is the external load in the routing rule's token units:
// every external request weighs request_cost, as a local reservation does.
func (e External) LoadTokens(requestCost int) float64 {
	return float64(e.Requests() * int64(requestCost))
}

// FusedLoad is load(r) of the routing rule with the external load added
// to this instance's live reservations now (selection.Router's units:
// in-flight requests x request_cost + pending prefill + resident tokens).
func FusedLoad(now Local, e External, requestCost int) float64 {
	return float64((now.Inflight+e.Requests())*int64(requestCost) + now.PendingPrefill + now.ResidentTokens)
}
