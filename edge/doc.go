// Package edge is the client-facing edge of a ramjet route as plain
// net/http pieces, without Caddy: the OpenAI-shaped error responses
// (Error, Write, FromRequestError, FromStatus), the client API-key check
// (ClientAuth), the request header hygiene (StripRequestHeaders,
// UpstreamAuth) and the response header scrubbing of upstream addresses
// (ScrubList, ScrubHeaders), the allowed client paths (AllowList,
// NormalizePath) and the JSON route and content-type checks, and the
// request body read once, bounded, into a pooled reference-counted buffer
// that also caches the body's one parse (Body, ReadBody, Reader), under a
// read deadline and a minimum upload rate (BodyDeadline, 408 BodyTimeout).
//
// Package module drives these from its Caddy handlers (ramjet_guard,
// ramjet_models, ramjet_health, ramjet_observe), the body matcher and the
// lb_policy; nothing here knows about Caddy.
package edge
