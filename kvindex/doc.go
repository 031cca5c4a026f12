// Package kvindex is ramjet's precise prefix-cache index. It mirrors the
// block set of each engine replica from the engines' own KV-cache events
// (vLLM and SGLang publish them over ZMQ PUB sockets, msgpack-encoded),
// and answers, for a request's token ids, how many leading tokens each
// replica holds.
//
// The pieces, one file each:
//
//   - decode.go: the wire format (ZMQ frames [topic, seq, msgpack batch];
//     events BlockStored, BlockRemoved and AllBlocksCleared in both the
//     positional-array and the map encoding).
//   - index.go: the index itself. Router-side keys are recomputed from the
//     events' token ids with selection.HashTokenBlock, so they match the keys
//     the router computes for a tokenized request. Memory is bounded by one
//     global entry budget.
//   - predict.go: short-lived predicted entries for requests routed since
//     the last event.
//   - subscriber.go: one ZMQ SUB client per engine endpoint (and data-
//     parallel rank), with sequence checking, fencing and replay.
//   - tokenize.go: the bounded /tokenize preflight that turns a request
//     into token ids, with a cache and a concurrency limit.
//   - canary.go: exact-placement canaries that measure the index's accuracy
//     against the engines' reported cached tokens.
//   - precise.go: Precise, all of the above as one service with Start and
//     Close, configured with the upstream token and each engine's scheme,
//     and the selection.Annotator that Router.Route calls.
//
// kvindex knows nothing of Caddy; package module wires Precise into the
// ramjet load-balancing policy and handler, and the fleet simulation
// (bench/fleetsim) drives the same Precise in simulated time. Every type is safe for concurrent use unless its
// documentation says otherwise.
package kvindex
