// Package metrics holds ramjet's Prometheus series, without Caddy: the
// request-path collectors (a Set: routing decisions, requests by outcome,
// tokens, time to first token, durations), the fleet collector reading
// typed fleetstate.Snapshot values at scrape time, the precise path's
// collector reading typed KVSource values (kvindex.Precise), the ops
// port's gatherer without address-labelled families (WithoutAddresses), the
// classification of a finished request (OutcomeOf, ReasonLabel, Exchange)
// and Response, which accounts one response body as it streams (status,
// first byte, usage, end marker). The series a finished request updates
// are kept in one record per (upstream, model) pair and per upstream and
// exposed at scrape by a collector (record.go), so that a request touches
// few cache lines; the dashboard reads the same records when it samples
// (Set.DashboardSample).
//
// Names are ramjet_* and stable; labels are bounded sets (upstream: an
// opaque route id, model: a name from a bounded catalog.Names, outcome,
// reason, rule: fixed sets). Nothing a client controls becomes a label, and
// no address or prompt text ever appears in a series. Package module
// creates one Set per process and registers it (Register) into every
// config's registry.
package metrics
