// Command e2ecompare replays the fleet simulation's workloads (locality,
// burst, agent-fleet by default) through a real in-process Caddy against 8
// engine simulators (bench/enginesim, in scaled real time), once per
// load-balancing policy (lb_policy ramjet, round_robin, least_conn, or one of
// the fleet simulation's peers run inside Caddy by bench/peerproxy), with
// fresh engines for every run, and prints one table: cached-prompt share,
// TTFT p50/p95, output throughput and replica spread. Times are reported in
// simulated seconds (wall time x -time-scale) so they compare with the
// fleet simulation (bench/cmd/fleetsim). -density D runs the engines'
// tokenizer stand-in at D bytes per token and renders every row's tokens at
// it (bench/engine.Tokenizer): the engines run the same tokens, the router
// sees other bytes. See bench/loadgen/README.md.
package main
