// Package integrity is ramjet's opt-in engine integrity: it decides, per
// replica, whether an engine may be routed to, on evidence the engine
// itself gives, and keeps that decision across ramjet's own restarts.
//
// The pieces, one file each:
//
//   - identity.go: the identity contract (docs/identity.md): one GET
//     answering the model weights' digest, the chat template's digest, the
//     tokenizer's digest and an engine-instance id at once; the client that
//     fetches and checks it against the configured Pins, and the keyed
//     commitment of an attested instance.
//   - spec.go: the speculative-decoding acceptance counters (SpecSource,
//     with MetricsSource reading vLLM's /metrics) and the window detector
//     that sees acceptance collapse: N consecutive complete windows with
//     drafts but no accepted token, overall or at one draft position.
//   - store.go: the state file of quarantine commitments: HMAC-sealed,
//     written to a temporary file, fsynced, renamed and the directory
//     fsynced, behind a dirty marker written first and cleared last, so
//     that no crash at any step un-fences a fenced instance.
//   - monitor.go: Monitor, all of the above as one service with Start and
//     Close: per-replica admission with a reason, re-checked on an
//     interval, failing closed per replica; the quarantine in observe or
//     enforce mode, sticky until a different attested instance appears.
//   - shared.go: what a config reload shares: the settings with their
//     secrets resolved (Resolved) and their Fingerprint, and one Store per
//     state file among the services using it (AcquireStore).
//
// integrity knows nothing of Caddy (package module wires a Monitor into the
// ramjet policy's filters, /health, /ramjet/fleet and the metrics). Nothing
// it keeps, writes or logs holds a prompt or an engine address: replicas
// are named by the caller's key in memory only, and the state file holds
// keyed hashes of engine identities. Every exported type is safe for
// concurrent use unless its doc says otherwise.
package integrity
