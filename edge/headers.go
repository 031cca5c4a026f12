package edge

import (
	"net"
	"net/http"
	"slices"
	"strings"
)

// HeaderValue is h.Get(key) for a key already in canonical form (a
// constant such as "Content-Type"): the same first value, without Get's
// canonicalisation of the key on every call.
func HeaderValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// SetValues sets h's values of name, a key in canonical form, to vals, as
// they are (shared: never modify them), or removes name when vals is nil;
// a nil h is left alone.
func SetValues(h http.Header, name string, vals []string) {
	switch {
	case h == nil:
	case vals != nil:
		h[name] = vals
	default:
		delete(h, name)
	}
}

// StripRequestHeaders removes what a client must not be able to send to an
// engine: ramjet's own X-Ramjet-* headers, the data-parallel rank (the
// policy sets it) and hop-by-hop headers, including those named in
// Connection. It reports the credential headers UpstreamAuth replaces that
// h still holds, seen in the same pass (for UpstreamAuth.SetKnown), and
// h's Content-Type as HeaderValue would read it after the strip (the
// guard's body route: no lookup after the walk).
func StripRequestHeaders(h http.Header) (creds Creds, contentType string) {
	// One pass over the request's few headers instead of a map delete (a
	// hash of the name) per hop-by-hop name, most of them absent; it finds
	// Connection too (no lookup of a header most requests lack), whose
	// names go after it.
	var conn []string
	for name, vals := range h {
		// Both names begin with an X: most names are decided by their
		// first byte.
		if isHopHeader(name) || len(name) >= len("X-Ramjet-") && name[0]|0x20 == 'x' &&
			(strings.HasPrefix(name, "X-Ramjet-") || strings.EqualFold(name, "X-Data-Parallel-Rank") ||
				hasPrefixFold(name, "x-ramjet-")) {
			if name == "Connection" {
				conn = vals
			}
			delete(h, name)
		} else if name == "Content-Type" && len(vals) > 0 {
			contentType = vals[0] // as HeaderValue, without its lookup
		} else {
			creds |= credential(name)
		}
	}
	for _, v := range conn {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				name = http.CanonicalHeaderKey(name) // as h.Del
				delete(h, name)
				creds &^= credential(name)
				if name == "Content-Type" {
					contentType = ""
				}
			}
		}
	}
	return creds, contentType
}

// Creds is a set of the credential headers UpstreamAuth sets or deletes.
type Creds uint8

// The credential headers, by their canonical names.
const (
	CredAuthorization Creds = 1 << iota // Authorization
	CredAPIKey                          // Api-Key
	CredXAPIKey                         // X-Api-Key
	CredAll           = CredAuthorization | CredAPIKey | CredXAPIKey
)

// credential returns name's bit in Creds (name canonical), 0 for another
// header.
func credential(name string) Creds {
	switch name {
	case "Authorization":
		return CredAuthorization
	case "Api-Key":
		return CredAPIKey
	case "X-Api-Key":
		return CredXAPIKey
	}
	return 0
}

// isHopHeader reports whether name is one of the hop-by-hop headers of RFC
// 9110 section 7.6.1 or their common non-standard relatives, in canonical
// form: the form of every key Go's server stores.
func isHopHeader(name string) bool {
	switch name {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// ScrubList is what must never appear in a response header: every upstream
// host:port (a scheme:// prefix dropped), and its host when that is an IP
// address or a dotted name.
func ScrubList(upstreams []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, u := range upstreams {
		if _, after, ok := strings.Cut(u, "://"); ok {
			u = after
		}
		add(u)
		if host, _, err := net.SplitHostPort(u); err == nil {
			if net.ParseIP(host) != nil || strings.Contains(host, ".") {
				add(host)
			}
		}
	}
	return out
}

// ReduceScrub returns the entries of scrub (a ScrubList) that contain no
// other entry: a value that contains an entry dropped contains the entry
// it contains too, so ScrubHeaders removes the same headers with either
// list, and with fewer searches (an upstream's host:port goes when its
// host is in the list).
func ReduceScrub(scrub []string) []string {
	var out []string
	for i, s := range scrub {
		covered := false
		for j, t := range scrub {
			if j != i && t != s && strings.Contains(s, t) {
				covered = true
				break
			}
		}
		if !covered && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// ScrubHeaders removes from h every header with a value that contains one
// of scrub (a ScrubList).
func ScrubHeaders(h http.Header, scrub []string) {
	if len(scrub) == 0 {
		return
	}
	for name, vals := range h {
		for _, v := range vals {
			if containsAny(v, scrub) {
				delete(h, name)
				break
			}
		}
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
