// Package module is the Caddy glue of ramjet: the lb_policy, the request-body
// matcher, handlers, metrics, admin routes and the state kept across reloads.
// It is thin: routing decisions are made by package selection, which knows
// nothing of Caddy. Only the xcaddy command, bench and tests import it.
package module
