// Package enginesim is an OpenAI-compatible LLM engine simulator that
// behaves like vLLM where routing is concerned. Each data-parallel rank
// drives one bench/engine model in scaled real time (or instantly), and the
// server exposes vLLM's HTTP surface (chat and completions with streaming,
// tool calls, reasoning content and cached-token usage; /v1/models,
// /health, /tokenize, /metrics with vllm:* series, or SGLang's sglang:*
// series with Options.Metrics = MetricsSGLang), KV cache events on
// ZMQ PUB sockets in vLLM's wire format, request recording for proxy tests
// and fault injection.
//
// Tests, the demo, the load generator and ramjet's end-to-end tests start
// simulators in-process:
//
//	s, err := enginesim.Start(ctx, enginesim.Options{TimeScale: 20})
//	defer s.Close()
//	// s.URL() + "/v1" is an OpenAI base URL.
//
// bench/cmd/enginesim runs the same server as a command. See
// bench/engine/README.md for the full reference.
package enginesim
