// Package peerproxy runs a fleet-simulation peer policy (bench/fleetsim's
// reimplementations of SGLang's cache_aware, llm-d's weighted scorers,
// Dynamo's KV cost) inside a real Caddy, so that the peers face real HTTP
// timing in bench/cmd/e2ecompare as ramjet does, rather than only the
// simulation's.
//
// An Adapter owns one fleetsim.Policy and live fleetsim.Replica views of
// the engines: InFlight and Routed counted from its own decisions (a
// request is in flight from its pick to its response's end), Waiting,
// Running and KV usage scraped from the engines' /metrics on a short
// interval (enginemetrics.Scraper), and, for the policies that read KV
// events, each replica's cached blocks from the engines' ZMQ event feeds.
// Two Caddy modules drive it: the handler http.handlers.bench_peer reads
// the request body and tokenizes it as the engine simulator does
// (enginesim.PromptTokens, so block hashes match the engine's), and reports
// the first response byte (FirstToken) and the response's end (Done); the
// selection policy http.reverse_proxy.selection_policies.bench_peer calls
// Pick and Routed. Both name the Adapter Registered under a name.
//
// Bench only: nothing but e2ecompare (and tests) imports this package, so
// the shipped ramjet binary never registers these modules.
package peerproxy
