package edge

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// ClientAuth checks the API key a client presents against a fixed set.
// The zero value lets every request through.
type ClientAuth struct {
	keys [][]byte
}

// NewClientAuth returns the check for keys; none lets every request
// through.
func NewClientAuth(keys []string) ClientAuth {
	var a ClientAuth
	for _, k := range keys {
		a.keys = append(a.keys, []byte(k))
	}
	return a
}

// Check returns nil when no keys are configured or the request carries one
// of them (as "Authorization: Bearer <key>", "api-key: <key>" or
// "x-api-key: <key>"), else the 401 to send.
func (a ClientAuth) Check(r *http.Request) *Error {
	if len(a.keys) == 0 {
		return nil
	}
	key := r.Header.Get("Api-Key")
	if key == "" {
		key = r.Header.Get("X-Api-Key")
	}
	if v := r.Header.Get("Authorization"); v != "" {
		if scheme, tok, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Bearer") {
			key = strings.TrimSpace(tok)
		}
	}
	if key != "" {
		for _, k := range a.keys {
			if subtle.ConstantTimeCompare([]byte(key), k) == 1 {
				return nil
			}
		}
	}
	return NewError(http.StatusUnauthorized, TypeInvalidRequest, "invalid_api_key", "",
		"Incorrect or missing API key. Send it as Authorization: Bearer <key>.")
}

// SetUpstreamAuth sets the credentials an engine receives: the upstream
// token as a bearer token when one is configured (the client's api-key
// headers dropped), else the client's own Authorization and api-key
// headers when forward is set, else none.
func SetUpstreamAuth(h http.Header, token string, forward bool) {
	switch {
	case token != "":
		h.Set("Authorization", "Bearer "+token)
		h.Del("Api-Key")
		h.Del("X-Api-Key")
	case !forward:
		h.Del("Authorization")
		h.Del("Api-Key")
		h.Del("X-Api-Key")
	}
}
