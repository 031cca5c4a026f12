package main

import (
	"strings"

	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
)

// metricsSiteName is the in-process Caddy's site serving its metrics
// registry (Caddy's metrics handler), where the module's ramjet_* series
// are: the routing counters of a run in one process, which the -procs
// and -caddy-bin modes read from each process's admin /metrics.
const metricsSiteName = "metrics"

// metricsSite is that site. The metrics handler answers every request;
// the ramjet_dashboard handler after it is never reached but registers the
// process-wide ramjet_* series (ramjet_other_instances_seen...) in its
// Provision, as the admin API's module does where the admin endpoint is
// on (caddyrun turns it off); the reverse_proxy is never reached either.
func metricsSite(addrs []string) caddyrun.Site {
	return caddyrun.Site{Name: metricsSiteName, Policy: "round_robin", Upstreams: addrs[:1],
		Handlers: []map[string]any{{"handler": "metrics"}, {"handler": "ramjet_dashboard"}}}
}

// routingSeries are the series prefixes a row's KV summary keeps beside
// scrapeKV's: whether an instance saw others (the approximate path's
// agreement band and the wait rule's evidence), the approximate index's
// evictions and the prompts' learned bytes per real token (summed over
// the instances of a -routers row, as every series).
var routingSeries = []string{"ramjet_other_instances_seen", "ramjet_index_evictions_total", "ramjet_prompt_bytes_per_token"}

// scrapeRouting is scrapeKV's lines of the in-process Caddy's metrics
// site (running) plus routingSeries, condensed by summarizeKV.
func scrapeRouting(running *caddyrun.Running) (string, error) {
	lines, err := scrapeSeries("http://"+running.Addr[metricsSiteName], func(l string) bool {
		if kvSeries(l) {
			return true
		}
		for _, p := range routingSeries {
			if strings.HasPrefix(l, p) {
				return true
			}
		}
		return false
	})
	if err != nil {
		return "", err
	}
	return summarizeKV(lines), nil
}
