// Command overhead measures what a proxy costs: with simulated engines that
// answer instantly (bench/enginesim Instant mode), it measures in one run,
// interleaved, (a) direct to one engine, (b) Caddy reverse_proxy with
// round_robin and (c) Caddy with lb_policy ramjet, for small prompts, long
// (256 KiB) prompts and streaming responses, and reports throughput, p50
// and p99 latency, the process CPU time per request and the ratios c/b
// and c/a. Caddy and the engines run in-process on 127.0.0.1. See
// bench/loadgen/README.md. The issue 11 measurement in one command:
//
//	go run ./bench/cmd/overhead -engine echo -concurrency 1,16,32 -rounds 4 -round 1s -scenarios small,long-256KiB
//
// -cpuprofile and -memprofile profile the whole process over the rounds.
// -parts also measures round_robin behind ramjet_guard, and behind
// ramjet_guard and ramjet_observe, so that what the edge handlers and the
// policy each add shows apart (a second table; parts_* in -json). -spin
// 10us also measures round_robin behind a handler that busy-waits 10µs per
// request: what that much serial handler work costs, to compare with
// ramjet's.
package main
