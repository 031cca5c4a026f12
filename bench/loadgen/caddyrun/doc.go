// Package caddyrun runs a real Caddy in-process in front of engines, one
// listener per load-balancing policy, for the load generator's tests, the
// overhead benchmark and the end-to-end comparison. It imports Caddy's
// standard modules and ramjet's module package, so that "ramjet" is a
// selection policy like round_robin and least_conn.
//
// Caddy keeps one running configuration per process: Start replaces it
// and Stop unloads it. Callers must not run two at once.
package caddyrun
