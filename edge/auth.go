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

// UpstreamAuth sets the credentials an engine receives: the upstream token
// as a bearer token when one is configured (the client's api-key headers
// dropped), else the client's own Authorization and api-key headers when
// forward is set, else none. Build it once (NewUpstreamAuth): Set then
// builds no header value of its own but the one-element slice.
type UpstreamAuth struct {
	bearer  string // "Bearer <token>", "" without a token
	forward bool
}

// NewUpstreamAuth returns the credentials setter for token and forward.
func NewUpstreamAuth(token string, forward bool) UpstreamAuth {
	a := UpstreamAuth{forward: forward}
	if token != "" {
		a.bearer = "Bearer " + token
	}
	return a
}

// Set sets the engine's credentials in h, a request header whose keys are
// in canonical form (the form of every key Go's server stores): the
// constant names are deleted without Del's canonicalisation.
func (a UpstreamAuth) Set(h http.Header) {
	a.SetKnown(h, CredAll)
}

// SetKnown is Set for a header known to hold none of the credential
// headers but those in creds: only those are deleted (StripRequestHeaders
// reports them from the pass it makes anyway; a delete costs a hash of
// the name, present or not).
func (a UpstreamAuth) SetKnown(h http.Header, creds Creds) {
	switch {
	case a.bearer != "":
		h["Authorization"] = []string{a.bearer}
		creds &^= CredAuthorization
	case a.forward:
		return
	}
	if creds&CredAuthorization != 0 {
		delete(h, "Authorization")
	}
	if creds&CredAPIKey != 0 {
		delete(h, "Api-Key")
	}
	if creds&CredXAPIKey != 0 {
		delete(h, "X-Api-Key")
	}
}
