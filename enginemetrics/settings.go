package enginemetrics

import (
	"fmt"
	"math"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/upstream"
)

// Settings is the JSON configuration of the scraper (the ramjet policy's
// "engine_metrics", module.RamjetSelection.EngineMetrics): it turns on
// scraping of every upstream engine's Prometheus metrics (vLLM's vllm:*
// or SGLang's sglang:* series): running and waiting requests, KV-cache usage and
// capacity, speculative-decoding counters. Each replica's snapshot, fused
// with this instance's own reservations, is added to the routing load
// (the requests others sent it count as this instance's own do; a stale
// replica counts local reservations only), sets the index's KV capacity
// of the replica, and is shown in the admin API's /ramjet/fleet; the
// scrapes are counted in ramjet_engine_* metrics. Off by default; with
// it off nothing is scraped.
type Settings struct {
	// Interval is the time between two scrapes of each engine.
	// Default: 1s. In the Caddyfile: engine_metrics [<interval>] { ... }.
	Interval duration.Duration `json:"interval,omitempty" caddyfile:"arg"`
	// Timeout bounds one scrape. Default: the interval, at most 5s.
	Timeout duration.Duration `json:"timeout,omitempty"`
	// Path is the metrics path on each upstream. Default: "/metrics".
	Path string `json:"path,omitempty"`
	// Access is how the engines' metrics are reached: scheme ("http" or
	// "https", default "http") and upstream_token (sent as
	// "Authorization: Bearer <token>", placeholders resolved; default
	// none).
	upstream.Access
	// StaleAfter is how many intervals a replica's last good scrape stays
	// usable while later scrapes fail; past it the replica counts as
	// stale (local reservations only). Default: 3.
	StaleAfter int `json:"stale_after,omitempty"`
	// MaxBodyBytes bounds one metrics page, in bytes. Default: 4 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// Concurrency bounds the scrapes in flight. Default: 8.
	Concurrency int `json:"concurrency,omitempty"`
	// Agree turns the agreement band on (selection.Options.AgreeExt) as
	// soon as a scrape reports requests this instance did not reserve,
	// rather than once the answers show other instances' placements:
	// several instances on the default path (no kv_events) then place a
	// shared prefix or an agent's context where every instance does from
	// the start. In the fleet simulation, 2 and 4 instances at 8 and 64
	// replicas met issue 13's bar in 10 of 16 rows with it, 1 with
	// engine_metrics alone, 6 with neither (bench/RESULTS.md, 2026-12-05,
	// "the agreement from the first scrape"). Default: off.
	Agree bool `json:"agree,omitempty"`
	// Overflow makes the routing rule's overflow term (the load a
	// replica pays per token of KV it lacks for the request beside its
	// running ones) read the engine's reported KV usage at the last
	// scrape plus this instance's reservations since
	// (selection.Options.EngineOverflow), rather than estimate it from
	// this instance's own in-flight contexts, which count a prefix that
	// requests of different sessions share (an agent framework's tools
	// and system prompt) once per request. In the fleet simulation, the
	// tool-agent trace at 65,536 tokens of KV per replica: TTFT p95 6.90
	// -> 2.76 s, cached share 0.75 -> 0.81; but agent-fleet at 8
	// replicas (contexts past every cache) loses 4-8% of its TTFT p99,
	// and the tool-agent trace at the default KV its p99 (bench/RESULTS.md, 2026-12-06, "the overflow term from the
	// engines' KV usage"). Default: off.
	Overflow bool `json:"overflow,omitempty"`
	// Queue, when positive, charges each request an engine reports
	// waiting that this instance did not send Queue tokens of load beside
	// request_cost (selection.Options.EngineQueue), so that several
	// instances' turns leave a home whose engine queue is long though each
	// instance sent little of it. A lone instance routes as without it;
	// a stale replica counts local reservations only. In the fleet
	// simulation with kv_events, 32768 takes the tool-agent trace at 8
	// replicas with 2 and 4 instances to TTFT p99 0.97x and 0.98x one
	// instance's (medians of 12 traces; 1.57x and 1.75x without), but
	// turns short queues into moves where the fleet is not saturated:
	// the trace at 64 replicas with 4 instances 1.06x -> 2.37x (with
	// queue_sat 0.25 no cost there, the gain at 8 kept: 0.96x and 0.98x),
	// the conversation trace at 8 1.24x -> 1.38x (bench/RESULTS.md,
	// 2026-12-06, "the engines' own queues"). Default: 0 (off).
	Queue float64 `json:"queue,omitempty"`
	// QueueSat, when positive, scales Queue's charge by the fleet's mean
	// of those waiting requests per replica over QueueSat, at most 1
	// (selection.Options.EngineQueueSat): a saturated fleet's queues
	// count whole, an unsaturated one's (a request waiting for the next
	// step) little. Default: 0 (no scale).
	QueueSat float64 `json:"queue_sat,omitempty"`
}

// SetDefaults fills the zero path and scheme (the scraper fills the rest).
func (c *Settings) SetDefaults() {
	if c.Path == "" {
		c.Path = "/metrics"
	}
	c.Access.SetDefaults()
}

// Validate names the bad setting.
func (c *Settings) Validate() error {
	if c.Path[0] != '/' {
		return fmt.Errorf("engine_metrics: path must start with '/', got %q", c.Path)
	}
	if err := c.Access.Validate("engine_metrics"); err != nil {
		return err
	}
	if err := c.Config("").Validate(); err != nil {
		return fmt.Errorf("engine_metrics: %w", err)
	}
	if !(c.Queue >= 0) || math.IsInf(c.Queue, 1) {
		return fmt.Errorf("engine_metrics: queue must be a finite number of tokens, 0 or more, got %v", c.Queue)
	}
	if !(c.QueueSat >= 0) || math.IsInf(c.QueueSat, 1) {
		return fmt.Errorf("engine_metrics: queue_sat must be a finite number, 0 or more, got %v", c.QueueSat)
	}
	return nil
}

// Config is the scraper configuration of c; token is the resolved
// upstream_token.
func (c *Settings) Config(token string) Config {
	return Config{Interval: time.Duration(c.Interval), Timeout: time.Duration(c.Timeout),
		MaxBodyBytes: c.MaxBodyBytes, Concurrency: c.Concurrency, StaleAfter: c.StaleAfter,
		Token: token}
}
