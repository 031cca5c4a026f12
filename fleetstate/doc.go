// Package fleetstate is the Caddy-free state of one ramjet fleet: the set of
// replicas shared by every ramjet policy with the same state_key. It holds
// the fleet's selection.Router (index, registry, live load), the router
// retuned with the knobs of the policy provisioned last, the outlier
// detector, and the opaque route ids (X-Ramjet-Upstream) that name replicas
// outside ramjet, keyed by an HMAC secret.
//
// It also holds what is computed from that state for the outside world:
// point-in-time snapshots (the metrics' fleet series, the dashboard's gauges
// and the admin API's GET /ramjet/fleet), the explanation of a routing
// decision (POST /ramjet/explain), the /health report, and Latest, the
// lock-free map from a state_key to the state provisioned last under it.
//
// Replicas leave a fleet through Depart, which a Sweeper runs periodically
// over the union of the live policies' upstream pools (Sweepers keeps one
// per fleet from its first policy to its last).
//
// Package module keeps a Fleet per state_key across config reloads (in a
// caddy.UsagePool, under PoolKey; its optional parts under SettingsKey)
// and adds the health that Caddy's upstream pools report;
// package metrics reads the snapshots. No address ever leaves a snapshot:
// replicas are named by their route id.
package fleetstate
