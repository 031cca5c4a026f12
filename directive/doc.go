// Package directive is the ramjet Caddyfile directive: a shorthand that
// expands into the JSON of the ramjet modules (package module), a
// production-tuned reverse_proxy with lb_policy ramjet, GET /health,
// GET /v1/models and the request guard. Importing it registers the
// directive (ordered after reverse_proxy).
package directive
