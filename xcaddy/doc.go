// Command ramjet is Caddy with the standard modules and the ramjet modules
// built in: `go build -o ramjet ./xcaddy`.
//
// Besides Caddy's own commands it has `ramjet healthcheck` (a shell-free
// probe for container health checks) and its own `ramjet version`, which
// reports the ramjet release, the commit and the Caddy version.
package main
