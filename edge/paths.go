package edge

import (
	"errors"
	"fmt"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/ramjet-llm/ramjet/selection"
)

// DefaultAllowedPaths are the client routes ramjet serves: the OpenAI API it
// routes and answers itself. Anything else (the engines' /metrics,
// /reset_prefix_cache, /sleep, /flush_cache, ...) is a 404 unless allowed
// with allow_paths.
var DefaultAllowedPaths = []string{
	"/v1/chat/completions",
	"/v1/completions",
	"/v1/responses",
	"/v1/embeddings",
	"/v1/models",
	"/v1/models/*",
	"/health",
}

// NormalizePath is the form in which a client path is matched and then
// forwarded: dot segments resolved, repeated slashes collapsed, a trailing
// slash dropped and lower case (Caddy's path matcher is case-insensitive
// too), so that //v1/chat/completions, /v1/x/../chat/completions and
// /V1/CHAT/COMPLETIONS are all /v1/chat/completions.
func NormalizePath(p string) string {
	if p == "" {
		return "/"
	}
	return strings.ToLower(path.Clean(p))
}

// AllowList is the set of served client paths: DefaultAllowedPaths plus
// the extra ones, exact or prefixes written "/prefix/*".
type AllowList struct {
	exact  map[string]bool
	prefix []string
}

// NewAllowList compiles DefaultAllowedPaths and extra (checked with
// CheckAllowPath).
func NewAllowList(extra []string) AllowList {
	a := AllowList{exact: map[string]bool{}}
	for _, p := range append(append([]string(nil), DefaultAllowedPaths...), extra...) {
		if pre, ok := strings.CutSuffix(p, "/*"); ok {
			a.prefix = append(a.prefix, NormalizePath(pre)+"/")
			continue
		}
		a.exact[NormalizePath(p)] = true
	}
	return a
}

// Allow normalises the request path and reports whether it is served. An
// allowed request continues with the normalised path (the engine, the body
// checks and the policy's affinity all see the canonical route).
func (a AllowList) Allow(r *http.Request) bool {
	// The API routes are in every list (DefaultAllowedPaths): their switch
	// answers before the map's hash.
	if IsAPIPOSTRoute(r.URL.Path) || a.exact[r.URL.Path] {
		// Already a normalised path (the exact paths are, and
		// NormalizePath leaves a normalised path as it is): nothing to
		// clean or rewrite.
		return true
	}
	p := NormalizePath(r.URL.Path)
	ok := a.exact[p]
	for _, pre := range a.prefix {
		if ok {
			break
		}
		ok = strings.HasPrefix(p, pre)
	}
	if !ok {
		return false
	}
	if p != r.URL.Path {
		r.URL.Path, r.URL.RawPath = p, ""
	}
	return true
}

// CheckAllowPath rejects an allow_paths entry that cannot match: it must be
// an absolute path, with a "*" only as a final "/*".
func CheckAllowPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("%q must start with /", p)
	}
	if i := strings.IndexByte(p, '*'); i >= 0 && (i != len(p)-1 || !strings.HasSuffix(p, "/*")) {
		return fmt.Errorf("%q: a * may only end a path, as /prefix/*", p)
	}
	return nil
}

// jsonRoutes are the OpenAI (and vLLM/SGLang) POST routes whose body must be
// a JSON object.
var jsonRoutes = map[string]bool{
	"/v1/chat/completions": true,
	"/v1/completions":      true,
	"/v1/responses":        true,
	"/v1/embeddings":       true,
	"/v1/moderations":      true,
	"/v1/score":            true,
	"/v1/rerank":           true,
	"/v2/rerank":           true,
	"/rerank":              true,
	"/score":               true,
	"/pooling":             true,
	"/classify":            true,
	"/tokenize":            true,
	"/detokenize":          true,
	"/generate":            true,
}

// IsAPIPOSTRoute reports whether path (normalised) is a default API route
// whose POST body must be JSON.
func IsAPIPOSTRoute(path string) bool {
	// The default routes whose POST body must be JSON (415 otherwise): a
	// switch, compiled to a few length and byte compares, where a map
	// lookup hashes the path on every request.
	switch path {
	case "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings":
		return true
	}
	return false
}

// IsJSONRoute reports whether path is a POST route whose body is a JSON
// object.
func IsJSONRoute(path string) bool {
	return jsonRoutes[strings.TrimSuffix(path, "/")]
}

// IsJSONContent reports a JSON or absent content type. Multipart uploads
// (audio) are not JSON and are forwarded as they are.
func IsJSONContent(ct string) bool {
	if ct == "" || ct == "application/json" || ct == "application/json; charset=utf-8" {
		return true // what clients send, without mime's allocations
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// UnsupportedMedia is the 415 for a non-JSON body on a JSON API route.
func UnsupportedMedia() *Error {
	return NewError(http.StatusUnsupportedMediaType, TypeInvalidRequest, CodeUnsupportedMedia, "",
		"the request body must be JSON: send Content-Type: application/json")
}

// ReadError is the error to answer for a body ReadBody could not take
// (ErrTooLarge, or a MaxBytesReader's limit: 413 naming limit; any other
// read error: 400), or nil for none.
func ReadError(err error, limit int64) *Error {
	if err == nil {
		return nil
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, ErrTooLarge) || errors.As(err, &mbe):
		return TooLarge(limit)
	}
	return NewError(http.StatusBadRequest, TypeInvalidRequest, "", "", "the request body could not be read")
}

// BodyRoute says whether the body of a request is validated by a parse,
// and on which selection endpoint: POST bodies of the LLM routes always
// (the policy fingerprints them whatever the content type), of the other
// JSON routes when they say JSON. A default API route sent another
// content type gets the 415 to answer.
func BodyRoute(method, path, contentType string) (selection.Endpoint, bool, *Error) {
	if method != http.MethodPost {
		return selection.EndpointUnknown, false, nil
	}
	if IsAPIPOSTRoute(path) && !IsJSONContent(contentType) {
		return selection.EndpointUnknown, false, UnsupportedMedia()
	}
	ep := selection.EndpointForPath(path)
	if ep == selection.EndpointUnknown && (!IsJSONRoute(path) || !IsJSONContent(contentType)) {
		return ep, false, nil
	}
	return ep, true, nil
}
