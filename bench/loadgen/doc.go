// Package loadgen replays numeric workload traces (package bench/workload)
// against a live OpenAI-compatible endpoint over HTTP and measures what the
// running proxy does: time to first token, inter-token latency, end-to-end
// latency, output throughput, the share of prompt tokens the engines served
// from their prefix cache, and how requests spread over replicas.
//
// All request content is synthesised deterministically from the trace's
// numbers (bench/workload), so the same trace always sends the same bytes
// and no prompt text is ever read from disk. Requests go through the
// official OpenAI Go SDK (github.com/openai/openai-go/v3), streaming, with
// stream_options.include_usage so that prompt, cached and output token
// counts come from the server.
//
// The commands bench/cmd/loadgen, bench/cmd/overhead and bench/cmd/e2ecompare
// are thin wrappers around this package; see README.md.
package loadgen
