package fleetstate

// ReplicaHealth is one replica in the /health answer.
type ReplicaHealth struct {
	ID      string `json:"id"`
	Healthy bool   `json:"healthy"`
	// Reason says why an unhealthy replica is out: "active_check" (Caddy's
	// active health check failed), "passive_failures" (recent failed
	// requests reached max_fails), "ejected" (outlier detection: its
	// recent answers failed), or "circuit_breaker"; "not_found" when
	// no matching reverse_proxy is configured.
	Reason   string `json:"reason,omitempty"`
	InFlight int    `json:"in_flight"`
	// Full is true when the replica is at its max_requests limit: usable
	// again as soon as a request ends.
	Full bool `json:"full,omitempty"`
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
