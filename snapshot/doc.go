// Package snapshot writes and reads authenticated snapshots of ramjet's
// approximate index, so that a restarted ramjet keeps routing prompts to
// the replicas that already hold them instead of learning the fleet again.
//
// A snapshot file holds, per replica, the block hashes the index believes
// it holds, in eviction order (selection.Router.ExportIndex). Replicas are
// named by a keyed hash of their replica key (ReplicaID), never by address
// or slot; a snapshot holds no text. Beside it a companion file (path +
// ".hmac") holds an HMAC-SHA256 over the snapshot's bytes under a key the
// operator keeps in the environment. Both are written atomically (temp
// file, fsync, rename, fsync of the directory: integrity.WriteFile).
//
// Read loads a snapshot only when the companion verifies and the index
// shape matches (format version, block size, prefix bound, bytes per
// token and the fingerprint's hash scheme, checked with a probe request);
// otherwise it says why with a Reason, and the caller starts cold.
// Replicas of the snapshot that are not in the current pool are dropped
// (Beliefs).
//
// A Writer runs them for one fleet: it reads the snapshot at start,
// applies it when a policy first sees its pool (Bind), writes the index
// periodically and at Close, and logs and counts each outcome (Metrics;
// package metrics creates the ramjet_snapshot_* collectors).
//
// snapshot knows nothing of Caddy; package module configures a Writer for
// the ramjet policy and keeps it across reloads (module/snapshot.go).
package snapshot
