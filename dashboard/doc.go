// Package dashboard is ramjet's built-in dashboard, without Caddy and
// without counters of its own: a Store that samples (SampleOf) the
// caller's counts (Gauges: finished requests with their tokens and those
// in flight by (upstream, model), routing decisions by reason, times to
// first token; package metrics' records) and the fleet's gauges (per-replica
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
