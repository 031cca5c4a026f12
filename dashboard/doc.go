// Package dashboard is ramjet's built-in dashboard, without Caddy: a
// Recorder of cumulative lock-free counters the caller finds once and keeps
// (routing decisions by reason, requests in flight by model, a Tally per
// (upstream, model) of finished requests with their tokens and time to
// first token),
// a Store that samples the Recorder and the fleet's gauges (per-replica
// load and health, index size) into a bounded ring and computes the rates
// and the TTFT quantiles the page charts from its own histograms, the
// bounded list of recent decisions, and the http.Handler serving the page,
// its embedded assets (no CDN, nothing built at run time) and data.json.
//
// Package module feeds it from ramjet's request path and serves it as the
// http.handlers.ramjet_dashboard Caddy module and the admin API's
// GET /ramjet/dashboard/data. Every id it sees is the opaque route id: no
// address or prompt text ever reaches it.
package dashboard
