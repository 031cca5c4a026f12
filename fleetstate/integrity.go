package fleetstate

// IntegrityReport is a replica's integrity state for /health (reason) and
// /ramjet/fleet.
type IntegrityReport struct {
	Out         bool    `json:"out"`
	Reason      string  `json:"reason,omitempty"`
	Attested    bool    `json:"attested"`
	Quarantined bool    `json:"quarantined,omitempty"`
	Durable     bool    `json:"durable,omitempty"`
	Observed    bool    `json:"observed,omitempty"`
	Streak      int     `json:"zero_acceptance_windows,omitempty"`
	Ratio       float64 `json:"acceptance_ratio"`
}

// ExplainSession is the session shadow's side of POST /ramjet/explain,
// when the request carries the session header.
type ExplainSession struct {
	// Known: the session has been seen; StickyUpstream is the replica a
	// session-sticky policy would route it to ("" when new).
	Known          bool   `json:"known"`
	StickyUpstream string `json:"sticky_upstream"`
	// Agree: the sticky choice is the decision (a new session agrees).
	Agree bool `json:"agree"`
	// Counts are the fleet's outcomes so far.
	Counts map[string]uint64 `json:"counts"`
}
