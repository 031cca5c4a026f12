package module

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/selection"
)

func init() {
	caddy.RegisterModule(Guard{})
	httpcaddyfile.RegisterHandlerDirective("ramjet_guard", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := new(Guard)
		err := m.UnmarshalCaddyfile(h.Dispenser)
		return m, err
	})
	httpcaddyfile.RegisterDirectiveOrder("ramjet_guard", httpcaddyfile.Before, "reverse_proxy")
}

// DefaultMaxBodySize is the largest request body the guard accepts by
// default: the policy's DefaultMaxBodyBytes (16 MiB), so that every accepted
// body is also fingerprinted.
const DefaultMaxBodySize = DefaultMaxBodyBytes

// Guard is the client-facing edge of a ramjet route (module
// http.handlers.ramjet_guard). Before the request is proxied it:
//
//   - strips client-supplied X-Ramjet-* and X-data-parallel-rank headers and
//     hop-by-hop headers;
//   - replaces the client's Authorization with the upstream token when one is
//     configured, and otherwise drops the client's credentials unless
//     forward_client_auth is set;
//   - reads the body once, bounded (413 beyond max_body_size), into the
//     per-request state, and parses it there with selection's parser (the
//     one parse the body matcher and the policy reuse): on the OpenAI JSON
//     POST routes a malformed body, one nested deeper than
//     selection.MaxDepth or a field of the wrong type gets an OpenAI-shaped
//     400 naming the problem and the field, and, when the fleet's models are
//     known, an unknown model (the decoded name) gets 404.
//
// After the rest of the chain it turns any error (no usable replica, engine
// unreachable, timeout) into an OpenAI-shaped JSON error without upstream
// addresses, and removes response headers that carry an upstream address.
// Everything it accepts is forwarded byte for byte.
type Guard struct {
	// Upstreams are the dial addresses (host:port) of the engines behind
	// this route. They are used to learn the fleet's models and to keep
	// these addresses out of response headers.
	Upstreams []string `json:"upstreams,omitempty"`

	// UpstreamToken is the bearer token sent to the engines instead of the
	// client's Authorization. Placeholders such as {env.RJ_UPSTREAM_TOKEN}
	// are resolved once at provisioning, so the token need not appear in the
	// stored config. Empty means no token.
	UpstreamToken string `json:"upstream_token,omitempty"`

	// ClientTokens, when set, are the API keys clients must present (as
	// "Authorization: Bearer <key>" or "api-key: <key>"); other requests get
	// 401. Comma- or space-separated; placeholders such as
	// {env.RJ_CLIENT_TOKENS} are resolved at provisioning. Empty means
	// ramjet does not authenticate clients.
	ClientTokens string `json:"client_tokens,omitempty"`

	// ForwardClientAuth forwards the client's Authorization (and api-key)
	// headers to the engines when no upstream token is configured. Off by
	// default: client credentials stay at the edge.
	ForwardClientAuth bool `json:"forward_client_auth,omitempty"`

	// MaxBodySize is the largest accepted request body, in bytes. Default
	// 16 MiB. Larger bodies get 413.
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	// ModelCheck controls the 404 for models the fleet does not serve:
	// "on" (default) rejects them once at least one engine has listed its
	// models; "off" forwards every model name.
	ModelCheck string `json:"model_check,omitempty"`

	// ModelsTimeout bounds one fetch of the engines' model lists. Default 2s.
	ModelsTimeout caddy.Duration `json:"models_timeout,omitempty"`

	// BodyTimeout bounds the reading of one request body; a client that
	// has not sent all of it by then gets 408 (slow or trickled uploads).
	// Default 60s.
	BodyTimeout caddy.Duration `json:"body_timeout,omitempty"`

	// AllowPaths are the paths served besides the OpenAI API
	// (DefaultAllowedPaths): exact paths, or prefixes ending in "/*".
	// Every other path gets an OpenAI-shaped 404 and never reaches an
	// engine. Paths are compared after normalisation (see normalizePath).
	AllowPaths []string `json:"allow_paths,omitempty"`

	allowExact  map[string]bool
	allowPrefix []string

	token   string
	auth    clientAuth
	fleet   *catalog.Catalog
	fleetK  string
	scrub   []string
	logger  *zap.Logger
	checkOn bool
}

// CaddyModule returns the Caddy module information.
func (Guard) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.ramjet_guard",
		New: func() caddy.Module { return new(Guard) },
	}
}

// UnmarshalCaddyfile sets up the guard from Caddyfile tokens. Syntax:
//
//	ramjet_guard [<upstreams...>] {
//	    upstream_token      <token>
//	    client_tokens       <keys...>
//	    forward_client_auth
//	    max_body_size       <size>
//	    model_check         on|off
//	    models_timeout      <duration>
//	    allow_paths         <paths...>
//	}
//
// Upstreams may be space- or comma-separated. An option given without a
// value (an unset {$ENV}) keeps its default.
func (g *Guard) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	g.Upstreams = append(g.Upstreams, splitList(d.RemainingArgs())...)
	seen := map[string]bool{}
	for d.NextBlock(0) {
		name := d.Val()
		if seen[name] {
			return d.Errf("duplicate option %q", name)
		}
		seen[name] = true
		args := d.RemainingArgs()
		var err error
		switch name {
		case "upstream_token":
			g.UpstreamToken, err = optionalArg(d, args)
		case "client_tokens":
			g.ClientTokens = strings.Join(args, ",")
		case "forward_client_auth":
			if len(args) != 0 {
				return d.ArgErr()
			}
			g.ForwardClientAuth = true
		case "max_body_size":
			g.MaxBodySize, err = parseSizeArg(d, args)
		case "model_check":
			g.ModelCheck, err = optionalArg(d, args)
		case "models_timeout":
			g.ModelsTimeout, err = parseDurationArg(d, args)
		case "allow_paths":
			g.AllowPaths, err = parseAllowPaths(d, args)
		default:
			return d.Errf("unknown ramjet_guard option %q", name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Provision resolves the token, fills defaults and joins the shared model
// list of this set of upstreams.
func (g *Guard) Provision(ctx caddy.Context) error {
	if err := CheckRetiredEnv(); err != nil {
		return err
	}
	g.logger = ctx.Logger()
	if g.MaxBodySize == 0 {
		g.MaxBodySize = DefaultMaxBodySize
	}
	if g.ModelCheck == "" {
		g.ModelCheck = "on"
	}
	if g.ModelsTimeout == 0 {
		g.ModelsTimeout = caddy.Duration(DefaultModelsTimeout)
	}
	if g.BodyTimeout == 0 {
		g.BodyTimeout = caddy.Duration(DefaultBodyTimeout)
	}
	g.token = resolveSecret(g.UpstreamToken)
	g.auth = newClientAuth(g.ClientTokens)
	g.checkOn = g.ModelCheck == "on"
	g.allowExact, g.allowPrefix = compileAllowPaths(g.AllowPaths)
	g.scrub = scrubList(g.Upstreams)
	if len(g.Upstreams) > 0 {
		f, key, err := acquireModelList(g.Upstreams, g.token, time.Duration(g.ModelsTimeout))
		if err != nil {
			return err
		}
		g.fleet, g.fleetK = f, key
	}
	return nil
}

// Validate rejects bad values, naming the field.
func (g *Guard) Validate() error {
	switch {
	case g.MaxBodySize < 0:
		return fmt.Errorf("max_body_size must be positive, got %d", g.MaxBodySize)
	case g.ModelCheck != "on" && g.ModelCheck != "off":
		return fmt.Errorf("model_check must be on or off, got %q", g.ModelCheck)
	case g.ModelsTimeout < 0:
		return fmt.Errorf("models_timeout must be positive, got %v", g.ModelsTimeout)
	}
	for _, p := range g.AllowPaths {
		if err := checkAllowPath(p); err != nil {
			return fmt.Errorf("allow_paths: %w", err)
		}
	}
	return nil
}

// Cleanup releases the shared model list.
func (g *Guard) Cleanup() error {
	if g.fleet != nil {
		_, _ = modelLists.Delete(g.fleetK)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (g *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Only the API: the path is normalised first, so that no spelling of
	// an engine-internal route (or of an API route) skips the checks below.
	if !g.allow(r) {
		WriteAPIError(w, notFoundRoute())
		return nil
	}
	if ae := g.auth.check(r); ae != nil {
		WriteAPIError(w, ae)
		return nil
	}
	stripRequestHeaders(r.Header)
	switch {
	case g.token != "":
		r.Header.Set("Authorization", "Bearer "+g.token)
		r.Header.Del("Api-Key")
		r.Header.Del("X-Api-Key")
	case !g.ForwardClientAuth:
		r.Header.Del("Authorization")
		r.Header.Del("Api-Key")
		r.Header.Del("X-Api-Key")
	}

	lift := bodyDeadline(w, r, time.Duration(g.BodyTimeout)) // slowclient.go
	bodyErr := g.readBody(r)
	lift()
	if ae := bodyErr; ae != nil {
		if st := lookupRequest(r); st != nil {
			st.finish() // nothing was routed: release the body at once
		}
		WriteAPIError(w, ae)
		return nil
	}
	// Request trailers (read with the body) are never forwarded: they could
	// carry what stripRequestHeaders removes from the headers.
	r.Trailer = nil

	gw := &guardWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, scrub: g.scrub}
	err := next.ServeHTTP(gw, r)
	if err == nil {
		return nil
	}
	if gw.wroteHeader {
		// The response has started: nothing can be rewritten; let Caddy log it.
		return err
	}
	ae := apiErrorFromHandler(err)
	level := zapcore.DebugLevel
	if ae.Status >= 500 {
		level = zapcore.WarnLevel
	}
	if c := g.logger.Check(level, "request failed"); c != nil {
		c.Write(zap.Int("status", ae.Status), zap.Error(err))
	}
	WriteAPIError(gw, ae)
	return nil
}

// readBody reads the body once, bounded, into ramjet's per-request state
// (the policy then fingerprints the same bytes without reading again; the
// proxy forwards them byte for byte and can replay them on a retry), and
// validates it on JSON routes.
func (g *Guard) readBody(r *http.Request) *APIError {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	if r.ContentLength > g.MaxBodySize {
		return tooLarge(g.MaxBodySize)
	}
	st := requestState(r)
	st.readBody(r, g.MaxBodySize)
	switch {
	case errors.Is(st.bodyErr, errBodyTooLarge):
		return tooLarge(g.MaxBodySize)
	case bodyTimedOut(st.bodyErr):
		return bodyTimeoutError()
	case st.bodyErr != nil:
		var mbe *http.MaxBytesError
		if errors.As(st.bodyErr, &mbe) {
			return tooLarge(g.MaxBodySize)
		}
		return newAPIError(http.StatusBadRequest, errTypeInvalidRequest, "", "",
			"the request body could not be read")
	case st.body == nil:
		return nil
	}
	if r.Method != http.MethodPost {
		return nil
	}
	if apiPOSTRoutes[r.URL.Path] && !isJSONContent(r.Header.Get("Content-Type")) {
		return newAPIError(http.StatusUnsupportedMediaType, errTypeInvalidRequest, errCodeUnsupportedMedia, "",
			"the request body must be JSON: send Content-Type: application/json")
	}
	// The LLM routes are always parsed (the policy fingerprints them
	// whatever the content type); the other JSON routes when they say JSON.
	ep := selection.EndpointForPath(r.URL.Path)
	if ep == selection.EndpointUnknown && (!isJSONRoute(r.URL.Path) || !isJSONContent(r.Header.Get("Content-Type"))) {
		return nil
	}
	b := st.acquireBody()
	if b == nil {
		return nil // the request already ended
	}
	defer b.release()
	// The one parse of this body: the matcher and the policy reuse it.
	f, err := st.parse(sharedExtractor(), ep)
	if err != nil {
		return requestErrorAPI(err)
	}
	if len(f.Model) > 0 && g.checkOn && g.fleet != nil {
		model := string(f.Model)
		if known, listed := g.fleet.Knows(r.Context(), model); listed && !known {
			return newAPIError(http.StatusNotFound, errTypeInvalidRequest, errCodeModelNotFound, "model",
				fmt.Sprintf("The model `%s` does not exist.", model))
		}
	}
	return nil
}

// clientAuth checks the API key a client presents against a fixed set.
type clientAuth struct {
	keys [][]byte
}

func newClientAuth(spec string) clientAuth {
	var a clientAuth
	for _, k := range splitList([]string{resolveSecret(spec)}) {
		a.keys = append(a.keys, []byte(k))
	}
	return a
}

// check returns nil when no keys are configured or the request carries one
// of them, else the 401 to send.
func (a clientAuth) check(r *http.Request) *APIError {
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
	return newAPIError(http.StatusUnauthorized, errTypeInvalidRequest, "invalid_api_key", "",
		"Incorrect or missing API key. Send it as Authorization: Bearer <key>.")
}

func tooLarge(limit int64) *APIError {
	return newAPIError(http.StatusRequestEntityTooLarge, errTypeInvalidRequest, errCodeBodyTooLarge, "",
		fmt.Sprintf("the request body is larger than the limit of %s", humanize.IBytes(uint64(limit))))
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

func isJSONRoute(path string) bool {
	return jsonRoutes[strings.TrimSuffix(path, "/")]
}

// isJSONContent: a JSON or absent content type. Multipart uploads (audio)
// are not JSON and are forwarded as they are.
func isJSONContent(ct string) bool {
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// hopHeaders are the hop-by-hop headers of RFC 9110 section 7.6.1 and their
// common non-standard relatives.
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// stripRequestHeaders removes what a client must not be able to send to an
// engine: ramjet's own headers, the data-parallel rank (the policy sets it)
// and hop-by-hop headers, including those named in Connection.
func stripRequestHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
	for name := range h {
		if strings.HasPrefix(name, "X-Ramjet-") || strings.EqualFold(name, "X-Data-Parallel-Rank") ||
			hasPrefixFold(name, "x-ramjet-") {
			delete(h, name)
		}
	}
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// scrubList is what must never appear in a response header: every upstream
// host:port, and its host when that is an IP address or a dotted name.
func scrubList(upstreams []string) []string {
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

// guardWriter notes whether the response has started and removes response
// headers that carry an upstream address.
type guardWriter struct {
	*caddyhttp.ResponseWriterWrapper
	scrub       []string
	wroteHeader bool
}

func (w *guardWriter) WriteHeader(status int) {
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		w.scrubHeaders()
		w.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	if w.wroteHeader {
		return
	}
	w.wroteHeader = true
	w.scrubHeaders()
	w.ResponseWriterWrapper.WriteHeader(status)
}

func (w *guardWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriterWrapper.Write(p)
}

func (w *guardWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

func (w *guardWriter) scrubHeaders() {
	if len(w.scrub) == 0 {
		return
	}
	h := w.Header()
	for name, vals := range h {
		for _, v := range vals {
			if containsAny(v, w.scrub) {
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

// Interface guards.
var (
	_ caddy.Provisioner           = (*Guard)(nil)
	_ caddy.Validator             = (*Guard)(nil)
	_ caddy.CleanerUpper          = (*Guard)(nil)
	_ caddyhttp.MiddlewareHandler = (*Guard)(nil)
	_ caddyfile.Unmarshaler       = (*Guard)(nil)
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

// apiPOSTRoutes are the default routes whose POST body must be JSON (415
// otherwise).
var apiPOSTRoutes = map[string]bool{
	"/v1/chat/completions": true,
	"/v1/completions":      true,
	"/v1/responses":        true,
	"/v1/embeddings":       true,
}

// normalizePath is the form in which a client path is matched and then
// forwarded: dot segments resolved, repeated slashes collapsed, a trailing
// slash dropped and lower case (Caddy's path matcher is case-insensitive
// too), so that //v1/chat/completions, /v1/x/../chat/completions and
// /V1/CHAT/COMPLETIONS are all /v1/chat/completions.
func normalizePath(p string) string {
	if p == "" {
		return "/"
	}
	p = caddyhttp.CleanPath(p, true)
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return strings.ToLower(p)
}

// allow normalises the request path and reports whether it is served. An
// allowed request continues with the normalised path (the engine, the body
// checks and the policy's affinity all see the canonical route).
func (g *Guard) allow(r *http.Request) bool {
	p := normalizePath(r.URL.Path)
	ok := g.allowExact[p]
	for _, pre := range g.allowPrefix {
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

func compileAllowPaths(extra []string) (map[string]bool, []string) {
	exact := map[string]bool{}
	var prefix []string
	for _, p := range append(append([]string(nil), DefaultAllowedPaths...), extra...) {
		if pre, ok := strings.CutSuffix(p, "/*"); ok {
			prefix = append(prefix, normalizePath(pre)+"/")
			continue
		}
		exact[normalizePath(p)] = true
	}
	return exact, prefix
}

// checkAllowPath rejects an allow_paths entry that cannot match: it must be
// an absolute path, with a "*" only as a final "/*".
func checkAllowPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("%q must start with /", p)
	}
	if i := strings.IndexByte(p, '*'); i >= 0 && (i != len(p)-1 || !strings.HasSuffix(p, "/*")) {
		return fmt.Errorf("%q: a * may only end a path, as /prefix/*", p)
	}
	return nil
}

// parseAllowPaths reads allow_paths: space- or comma-separated paths; none
// (an unset environment variable) keeps the default API only.
func parseAllowPaths(d *caddyfile.Dispenser, args []string) ([]string, error) {
	out := splitList(args)
	for _, p := range out {
		if err := checkAllowPath(p); err != nil {
			return nil, d.Errf("allow_paths: %v", err)
		}
	}
	return out, nil
}

func notFoundRoute() *APIError {
	return newAPIError(http.StatusNotFound, errTypeInvalidRequest, errCodeUnknownURL, "",
		"Unknown request URL. This server serves only the OpenAI API (/v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models) and /health.")
}
