// Package upstream reads the engines of a ramjet route as an operator
// lists them, without Caddy: an address (host:port or http(s)://host:port,
// Parse), per-engine settings given once for all engines or once per
// engine (PerEngine), the reverse_proxy's upstream list with one entry per
// data-parallel rank (Dials), the base URLs of the handlers that call the
// engines themselves (BaseURLs), and the rank of each entry of an upstream
// list (Ranks).
//
// Package module uses it to expand the ramjet directive and to key the
// policy's replicas.
package upstream
