package fleetstate

import (
	"time"

	"github.com/ramjet-llm/ramjet/enginemetrics"
)

// EngineState is one replica's engine-reported state in /ramjet/fleet:
// its last good scrape, how the scrapes since went, and the external
// load fused from it (what this instance did not reserve). Errors are
// given by class only (never a message, which may name an address).
type EngineState struct {
	Upstream string `json:"upstream"`
	// State: pending, ok, error (last scrape failed, last good one still
	// used) or stale (local reservations only).
	State  string `json:"state"`
	Result string `json:"last_result"`
	Engine string `json:"engine"`
	// Metrics are the last good scrape's figures.
	Metrics             enginemetrics.RankMetrics `json:"metrics"`
	ScrapedAt           *time.Time                `json:"scraped_at,omitempty"`
	AgeSeconds          float64                   `json:"age_seconds"`
	ConsecutiveFailures int                       `json:"consecutive_failures"`
	// Local is this instance's reservations around the last good scrape;
	// External the fused load (enginemetrics.Fuse) now.
	Local    enginemetrics.Local    `json:"local_at_scrape"`
	External enginemetrics.External `json:"external"`
}
