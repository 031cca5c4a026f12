// Package latency holds Hist, the fixed-bucket latency histogram that
// ramjet's Caddy-free services keep for their metrics collectors (the
// tokenize preflight's in kvindex, the scrape durations in enginemetrics):
// recorded on the service's path, read at scrape time as Prometheus wants
// a histogram (cumulative counts per upper bound, sum, count). Standard
// library only.
package latency
