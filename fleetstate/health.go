package fleetstate

import (
	"encoding/json"
	"fmt"
	"net/http"
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
	Status   string          `json:"status"`
	Healthy  int             `json:"healthy"`
	Total    int             `json:"total"`
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
