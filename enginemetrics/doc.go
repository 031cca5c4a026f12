// Package enginemetrics scrapes the Prometheus /metrics endpoint of each
// LLM engine behind ramjet (vLLM or SGLang) on an interval and turns what
// the engine reports into a typed snapshot per replica: running and
// waiting requests, KV-cache usage and capacity in tokens, the
// speculative-decoding counters, when it was scraped and whether the
// last scrape failed.
//
// It is the engine-reported half of ramjet's load. The other half is what
// this ramjet instance reserved itself (selection.Router's live load);
// Fuse combines the two so that neither a burst since the last scrape
// (the engine's metrics lag) nor other ramjet instances' traffic (local
// reservations never see it) is invisible. A failing scrape keeps the
// last good figures until they are older than StaleAfter intervals; after
// that a replica falls back to local reservations only.
//
// The scraper is bounded everywhere: a timeout per scrape, a body-size
// limit, a concurrency limit, and one goroutine owned by Start/Close.
// Garbage, an error status, a stalled or huge response become an error
// state for that engine, never a panic or a hang. Parsing uses
// github.com/prometheus/common/expfmt.
//
// The package knows nothing of Caddy. The ramjet module (module/engines.go)
// starts one Scraper per fleet when the policy's engine_metrics option is
// set, feeds it the upstream pool, shows the snapshots in the admin API's
// /ramjet/fleet and registers Collector into Caddy's metrics registry;
// the routing core consumes Fuse's External per slot.
//
//	s, err := enginemetrics.New(enginemetrics.Config{Interval: time.Second})
//	s.SetTargets([]enginemetrics.Target{{URL: "http://10.0.0.5:8000/metrics",
//		Replicas: []enginemetrics.ReplicaRef{{Key: "10.0.0.5:8000", Rank: -1}}}})
//	s.Start(ctx)
//	defer s.Close()
//	snap, ok := s.Snapshot("10.0.0.5:8000")
//	ext := enginemetrics.Fuse(snap, time.Now())
package enginemetrics
