// Package catalog is ramjet's model catalogue, without Caddy: it asks every
// engine for its /v1/models list with a bounded client (a timeout per
// fetch, a bounded body, no redirects, no proxy), merges and de-duplicates
// the lists, rewrites the metadata so that no engine filesystem path
// (vLLM's "root"), host or port leaks, caches the result briefly and
// serves the last good list while no engine answers. Names is the one
// bounded registry of model names: the catalogue's listed models, the
// guard's unknown-model check and the metrics' model labels all read it.
// Serve answers GET /v1/models and /v1/models/{id} from the catalogue with
// OpenAI-shaped errors (package edge).
//
// Package module serves it as the http.handlers.ramjet_models Caddy module
// and the ramjet_guard's model check.
package catalog
