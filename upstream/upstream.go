package upstream

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Addr is one engine's address.
type Addr struct {
	Raw    string // as written
	Scheme string // "http" or "https"
	Dial   string // host:port
}

// Parse reads host:port or http(s)://host:port (a trailing "/" allowed,
// no path); the port defaults to the scheme's.
func Parse(s string) (Addr, error) {
	u := Addr{Raw: s, Scheme: "http"}
	rest := s
	if scheme, after, ok := strings.Cut(s, "://"); ok {
		switch scheme {
		case "http", "https":
			u.Scheme = scheme
		default:
			return u, fmt.Errorf("unsupported scheme %s:// (use http:// or https://)", scheme)
		}
		rest = after
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		if strings.Trim(rest[i:], "/") != "" {
			return u, fmt.Errorf("an upstream is a host and port, without a path")
		}
		rest = rest[:i]
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		if u.Scheme == "https" {
			host, port = rest, "443"
		} else {
			host, port = rest, "80"
		}
		if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
			return u, fmt.Errorf("invalid address")
		}
		host = strings.Trim(host, "[]")
	}
	if host == "" {
		return u, fmt.Errorf("missing host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return u, fmt.Errorf("invalid port %q", port)
	}
	u.Dial = net.JoinHostPort(host, port)
	return u, nil
}

// PerEngine spreads the values of setting name over n engines: none gives
// every engine def, one value applies to all, else there must be one per
// engine (noun names a value in the error).
func PerEngine(name, noun string, vals []string, n int, def string) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		out[i] = def
	}
	if len(vals) == 0 {
		return out, nil
	}
	if len(vals) != 1 && len(vals) != n {
		return nil, fmt.Errorf("%s: give one %s for all %d upstreams or one per upstream, got %d", name, noun, n, len(vals))
	}
	for i := range out {
		out[i] = vals[0]
		if len(vals) == n {
			out[i] = vals[i]
		}
	}
	return out, nil
}

// Dials is the reverse_proxy upstream list: each engine once per
// data-parallel rank (ranks[i] for addrs[i]), in order.
func Dials(addrs []Addr, ranks []int) []string {
	var out []string
	for i, u := range addrs {
		for range ranks[i] {
			out = append(out, u.Dial)
		}
	}
	return out
}

// BaseURLs is each engine once, as the handlers that call engines
// themselves (/v1/models) take it: the dial address, with https://
// in front for an https engine.
func BaseURLs(addrs []Addr) []string {
	out := make([]string, len(addrs))
	for i, u := range addrs {
		if u.Scheme == "https" {
			out[i] = "https://" + u.Dial
		} else {
			out[i] = u.Dial
		}
	}
	return out
}

// UsesTLS reports whether an engine is reached over https.
func UsesTLS(addrs []Addr) bool {
	for _, u := range addrs {
		if u.Scheme == "https" {
			return true
		}
	}
	return false
}

// Ranks returns, for each entry of an upstream list of dial addresses, its
// data-parallel rank: an address listed k > 1 times is k ranks 0..k-1 in
// order of appearance; one listed once has rank -1 (no rank).
func Ranks(dials []string) []int {
	count := make(map[string]int, len(dials))
	for _, d := range dials {
		count[d]++
	}
	seen := make(map[string]int, len(dials))
	out := make([]int, len(dials))
	for i, d := range dials {
		out[i] = -1
		if count[d] > 1 {
			out[i] = seen[d]
			seen[d]++
		}
	}
	return out
}
