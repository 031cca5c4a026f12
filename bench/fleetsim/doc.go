// Package fleetsim is a deterministic discrete-event simulation of a fleet
// of LLM engines (the engine model of bench/engine) fed by a workload trace
// (bench/workload), routing every request through a policy: ramjet's real
// selection code, or a reimplementation of a peer router's published
// algorithm with its published defaults.
//
// Simulated time, not wall time, drives the engines, so a run of many
// simulated minutes takes seconds. A run is a pure function of its
// configuration and seed.
//
// Per request the simulation synthesises the prompt's token ids
// (workload.Synth), routes it, submits it to the chosen engine and follows
// its first token and completion. Policies learn through four hooks: Pick,
// Routed, FirstToken and Done. ramjet's policies make the Caddy module's
// own calls: one selection.Router.Route per decision (with the module's
// kvindex.Precise annotator for ramjet-precise), PrefillDone at the first
// token and Release at completion.
package fleetsim
