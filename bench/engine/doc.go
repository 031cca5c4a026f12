// Package engine models one LLM inference engine (vLLM-like) as a pure,
// deterministic state machine: a tokenizer stand-in, a prefix cache of token
// blocks with chained hashes and LRU eviction, a continuous-batching scheduler
// with chunked prefill, a step timing model and optional speculative decoding.
//
// It has no goroutines and no wall clock: simulated time is a time.Duration
// that only moves when the caller advances it. The fleet simulation
// (bench/fleetsim) drives many engines from one discrete-event loop; the HTTP
// simulator (bench/enginesim) drives one engine per data-parallel rank in
// scaled real time.
//
// Driving protocol:
//
//	e := engine.New(cfg)
//	e.AdvanceTo(t, nil)       // move the clock to t (runs steps that end by t)
//	e.Submit(req)             // arrives at e.Now()
//	next, ok := e.NextEventTime() // end of the step in flight, if any work
//	evs = e.AdvanceTo(next, evs[:0])
//
// An Engine is not safe for concurrent use; callers serialise access.
package engine
