package fleetstate

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/ramjet-llm/ramjet/selection"
)

// ReplicaHealth is one replica in the /health answer.
type ReplicaHealth struct {
	ID      string `json:"id"`
	Healthy bool   `json:"healthy"`
	// Reason says why an unhealthy replica is out: "active_check" (Caddy's
	// active health check failed), "passive_failures" (recent failed
	// requests reached max_fails), "ejected" (outlier detection: its
	// recent answers failed), "integrity" (engine integrity holds it out:
	// see Integrity), or "circuit_breaker"; "not_found" when no matching
	// reverse_proxy is configured.
	Reason string `json:"reason,omitempty"`
	// Integrity is the engine-integrity reason when integrity is
	// configured (pending, unreachable, bad_status, malformed, partial,
	// model_mismatch, template_mismatch, tokenizer_mismatch,
	// spec_collapse, fenced), also for a replica observe mode keeps in.
	Integrity string `json:"integrity,omitempty"`
	InFlight  int    `json:"in_flight"`
	// Full is true when the replica is at its max_requests limit: usable
	// again as soon as a request ends.
	Full bool `json:"full,omitempty"`
	// KV is the replica's KV-event feed when the precise path is on.
	KV *KVFeedHealth `json:"kv,omitempty"`
}

// KVFeedHealth is a replica's KV-event feed in the /health answer (the
// precise path on). A replica whose feed is unhealthy stays usable: it is
// routed by the estimate until its stores land again.
type KVFeedHealth struct {
	// Healthy reports that the feed's stores land in the index and it is
	// fresh (its replica is routed by the exact overlap).
	Healthy bool `json:"healthy"`
	// Reason says why not: "stores_not_landing: <detail>" (e.g. every
	// store an orphan: the engine's parents or block size do not match
	// the index's), or "not_fresh" (no event yet, or fenced after a
	// sequence gap or reset).
	Reason string `json:"reason,omitempty"`
}

// HealthReport is the /health answer.
type HealthReport struct {
	Status  string `json:"status"`
	Healthy int    `json:"healthy"`
	Total   int    `json:"total"`
	// Panic is true when every replica is out and the ramjet policy routes
	// among those out only for their recent failures (reason
	// passive_failures): the status is then degraded, not unhealthy.
	Panic    bool            `json:"panic,omitempty"`
	Replicas []ReplicaHealth `json:"replicas"`
}

// Health states.
const (
	StatusOK        = "ok"
	StatusDegraded  = "degraded"
	StatusUnhealthy = "unhealthy"
)

// NewHealthReport counts the healthy replicas of reps: the status is ok
// when every replica is usable, degraded when some are out and unhealthy
// when none is (or there are none).
func NewHealthReport(reps []ReplicaHealth) HealthReport {
	if reps == nil {
		reps = []ReplicaHealth{} // "replicas":[], never null
	}
	rep := HealthReport{Total: len(reps), Replicas: reps}
	for _, rh := range reps {
		if rh.Healthy {
			rep.Healthy++
		}
	}
	switch {
	case rep.Total > 0 && rep.Healthy == rep.Total:
		rep.Status = StatusOK
	case rep.Healthy > 0:
		rep.Status = StatusDegraded
	default:
		rep.Status = StatusUnhealthy
	}
	return rep
}

// Write answers a GET or HEAD /health with rep as JSON (no body for
// HEAD): 200, or 503 when no replica is usable.
func (rep HealthReport) Write(w http.ResponseWriter, r *http.Request) error {
	body, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("encoding health: %w", err)
	}
	status := http.StatusOK
	if rep.Status == StatusUnhealthy {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
	return nil
}

// UpstreamHealth is what the proxy says of one upstream of a /health
// list.
type UpstreamHealth struct {
	Healthy  bool
	InFlight int
	Full     bool
	// Out says why the proxy holds an unhealthy upstream out
	// (ReplicaHealth.Reason: active_check, passive_failures,
	// circuit_breaker).
	Out string
}

// lookupSlot is the slot of the i-th replica in f (false without f).
func lookupSlot(f *Fleet, keys []string, i int) (selection.Slot, bool) {
	if f == nil {
		return 0, false
	}
	return f.Base().Lookup(keys[i])
}

// HealthOf is the /health answer for the upstream list dials. ups is the
// proxy's view of each entry, nil when no reverse_proxy over dials is
// configured (every replica "not_found"). With f (the fleet of the
// proxy's ramjet policy, nil when the proxy does not use it) replicas are
// named by f's route ids, so that /health matches X-Ramjet-Upstream; a
// replica the proxy holds usable is still out when outlier detection
// ejected it or integrity (integ, by replica key; nil report: integrity
// off) holds it out; feeds (by replica key, nil: the precise path off)
// adds each kv feed's health. Without f, ids name the replicas. With f,
// a fleet whose every replica is out but some only by passive failures is
// degraded (Panic), as the ramjet policy still routes to those; a replica
// out by passive failures that outlier detection also ejected is
// "ejected" (panic routing skips it).
func HealthOf(dials, ids []string, ups []UpstreamHealth, f *Fleet,
	integ func(key string) *IntegrityReport, feeds map[string]*KVFeedHealth) HealthReport {
	var keys []string
	if f != nil {
		ids, keys = ReplicaIDs(f.Secret(), dials), ReplicaKeys(dials)
	}
	reps := make([]ReplicaHealth, len(dials))
	for i := range dials {
		rh := ReplicaHealth{ID: ids[i]}
		if feeds != nil {
			rh.KV = feeds[keys[i]]
		}
		switch {
		case ups == nil:
			rh.Reason = "not_found"
		case !ups[i].Healthy:
			rh.InFlight, rh.Full, rh.Reason = ups[i].InFlight, ups[i].Full, ups[i].Out
			if s, ok := lookupSlot(f, keys, i); ok && rh.Reason == "passive_failures" && f.Detector().Ejected(s) {
				rh.Reason = "ejected" // not served in panic either
			}
		default:
			rh.Healthy, rh.InFlight, rh.Full = true, ups[i].InFlight, ups[i].Full
			if f == nil {
				break
			}
			if s, ok := lookupSlot(f, keys, i); ok && f.Detector().Ejected(s) {
				rh.Healthy, rh.Reason = false, "ejected"
			}
			if ir := integ(keys[i]); ir != nil {
				rh.Integrity = ir.Reason
				if ir.Out && rh.Healthy {
					rh.Healthy, rh.Reason = false, "integrity"
				}
			}
		}
		reps[i] = rh
	}
	rep := NewHealthReport(reps)
	if f != nil && rep.Healthy == 0 && slices.ContainsFunc(reps, func(rh ReplicaHealth) bool { return rh.Reason == "passive_failures" && !rh.Full }) {
		rep.Status, rep.Panic = StatusDegraded, true // the policy's panic routing serves
	}
	return rep
}
