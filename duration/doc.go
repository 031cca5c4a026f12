// Package duration is the JSON duration of ramjet's configuration,
// without Caddy: Duration decodes exactly as caddy.Duration does (a
// string in Caddy's duration syntax, "d" for days included, or an
// integer of nanoseconds) and encodes as an integer of nanoseconds, so
// that the config structs of the Caddy-free packages (kvindex's Settings)
// keep the JSON surface of the Caddy modules that embed them.
package duration
