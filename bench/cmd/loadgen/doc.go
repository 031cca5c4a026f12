// Command loadgen replays a numeric workload trace against an
// OpenAI-compatible endpoint and reports TTFT, inter-token latency,
// end-to-end latency, throughput, cached-prompt share and per-replica
// spread. See bench/loadgen/README.md.
package main
