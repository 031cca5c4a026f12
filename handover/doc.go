// Package handover is the Caddy listener wrapper caddy.listeners.ramjet_handover
// (Handover): at a config reload it carries HTTP/1.1 keep-alive connections
// that the old config's server closes over to the new config's server on the
// same socket, so that a client's next request on such a connection is
// answered instead of reset.
//
// It is not part of the request lifecycle: it sees connections, never
// requests, and knows nothing of ramjet's routing. Package module imports it
// for its registration, so a Caddy built with ramjet's modules has it;
// deploy/Caddyfile enables it in its global servers options.
package handover
