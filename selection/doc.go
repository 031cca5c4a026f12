// Package selection is ramjet's routing core: request body -> features ->
// chained block fingerprints -> prefix overlap per replica -> score -> pick.
//
// It depends only on the standard library and xxhash, and knows nothing of
// Caddy, HTTP or ZMQ: the Caddy module (package module), the fleet
// simulation (package bench/fleetsim) and the precise index (package
// kvindex) all drive the same code.
//
// The rule, for every usable replica r:
//
//	score(r) = min(overlap(r), AffinityCap) - Alpha * load(r)
//
// where overlap is in tokens and load(r) is the live work reserved on r, in
// tokens: RequestCost for every in-flight request plus the estimated
// uncached prompt tokens of requests whose prefill has not finished (and
// the decode-side terms and the busy guard of Options). Ties
// within TieEpsilon are broken by the deeper raw overlap, the requested
// output length against the replica's engine profile, a rendezvous hash of
// the prompt's first block, and finally the lower load. Over a fleet of
// at least SubsetGuardReplicas, a cold winner may give way to a holder of
// part of the prompt (Options.WarmHold).
//
// Router.Route is one decision with its side effects (an optional
// Annotator's exact overlaps, Pick, Reserve, Learn); Pick alone decides
// without side effects (explain).
//
// Concurrency: a Router is safe for concurrent use. Pick takes a read lock on
// the index once per decision and allocates nothing; Learn takes the write
// lock. Reservations are atomic counters. With Index.SetLearnQueue, Route
// hands a long prompt's learn to a goroutine instead of making it before it
// returns; every index reader and writer applies the queued learns first,
// so decisions are those of the inline learn (learnq.go).
package selection
