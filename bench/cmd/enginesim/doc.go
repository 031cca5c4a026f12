// Command enginesim runs the engine simulator: an OpenAI-compatible server
// that behaves like vLLM where routing is concerned (prefix cache, queue,
// batch slots, timing, KV cache events, faults). See bench/engine/README.md.
//
//	go run ./bench/cmd/enginesim -addr 127.0.0.1:8001 -dp 2 -time-scale 10
package main
