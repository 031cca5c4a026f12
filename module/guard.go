package module

import (
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ramjet-llm/ramjet/caddyblock"
	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/observe"
)

func init() {
	caddy.RegisterModule(Guard{})
	registerHandler[Guard]("ramjet_guard", httpcaddyfile.Before, "reverse_proxy")
}

// DefaultMaxBodySize is the largest request body the guard accepts by
// default (edge.DefaultMaxBodySize, also the policy's DefaultMaxBodyBytes).
const DefaultMaxBodySize = edge.DefaultMaxBodySize

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
	// Engines are the engines behind this route (their dial addresses are
	// kept out of response headers), the token sent to them and the
	// client keys checked.
	Engines

	// The guard's own settings: forward_client_auth, max_body_size,
	// model_check, models_timeout, body_timeout, body_min_rate and
	// allow_paths (see edge.GuardSettings).
	edge.GuardSettings

	allow edge.AllowList
	creds edge.UpstreamAuth

	scrubFn func(http.Header) // scrubs a response header of upstream addresses
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
//	    body_min_rate       <size per second>
//	    allow_paths         <paths...>
//	}
//
// Upstreams may be space- or comma-separated. An option given without a
// value (an unset {$ENV}) keeps its default.
func (g *Guard) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return g.parse(d, "ramjet_guard", g)
}

// Provision resolves the token, fills defaults and joins the shared model
// list of this set of upstreams.
func (g *Guard) Provision(ctx caddy.Context) error {
	g.logger = ctx.Logger()
	g.SetDefaults()
	g.checkOn = g.ModelCheck == "on"
	g.allow = edge.NewAllowList(g.AllowPaths)
	scrub := edge.ReduceScrub(edge.ScrubList(g.Upstreams))
	g.scrubFn = func(h http.Header) { edge.ScrubHeaders(h, scrub) }
	if err := g.provision(time.Duration(g.ModelsTimeout), len(g.Upstreams) > 0); err != nil {
		return err
	}
	g.creds = edge.NewUpstreamAuth(g.token, g.ForwardClientAuth)
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (g *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Only the API: the path is normalised first, so that no spelling of
	// an engine-internal route (or of an API route) skips the checks below.
	if !g.allow.Allow(r) {
		edge.Write(w, edge.NotFoundRoute())
		return nil
	}
	if ae := g.auth.Check(r); ae != nil {
		edge.Write(w, ae)
		return nil
	}
	creds, ctype := edge.StripRequestHeaders(r.Header)
	g.creds.SetKnown(r.Header, creds)

	var st *reqState
	reuse := false // the chain returned no error: the state may be pooled
	if r.Body != nil && r.Body != http.NoBody {
		// The guard wraps the whole chain: a request state it creates ends
		// when it returns (no sweeper registration), and is recycled.
		var created bool
		if st, created = ownedState(w, r); created {
			defer func() { st.recycle(reuse) }()
		}
	}
	noDeadline := true
	ir, iw := caddyhttp.IdleTimeoutsFromContext(r.Context()) // iw: for the ramjet handler behind (below)
	if st != nil && !st.bodyRead && g.BodyMinRate == 0 && ir != nil && idleBounds(&ir.Deadline, time.Duration(g.BodyTimeout)) {
		// Caddy's read idle timeout bounds the first read: the deadline
		// waits for a second one (edge.DeferredDeadline).
		st.bodyDL.Defer(w, r, time.Duration(g.BodyTimeout))
	} else {
		noDeadline = edge.BodyDeadline(w, r, time.Duration(g.BodyTimeout), g.BodyMinRate)
	}
	bodyErr := g.readBody(r, st, ctype)
	if !noDeadline {
		edge.LiftBodyDeadline(w)
	} else if st != nil {
		st.bodyDL.Lift()
	}
	if ae := bodyErr; ae != nil {
		if st != nil {
			st.finish() // nothing was routed: release the body at once
		}
		edge.Write(w, ae)
		return nil
	}
	// Request trailers (read with the body) are never forwarded: they could
	// carry what stripRequestHeaders removes from the headers.
	r.Trailer = nil

	// Behind the ramjet handler (deploy/Caddyfile's order) its writer
	// scrubs for the guard; otherwise the guard's own writer is the
	// handler's of the request state when there is one (the handler behind
	// adopts it; a second guard on the same request allocates its own).
	gw, _ := w.(*observe.Writer)
	if gw == nil || !gw.SetScrub(g.scrubFn) {
		if st != nil && !st.obsvInUse && !st.guardW {
			gw, st.guardW = &st.obsv.w, true
		} else {
			gw = new(observe.Writer)
		}
		gw.Init(w, nil)
		gw.SetScrub(g.scrubFn)
		gw.SetWriteTimeout(0, nil, (*idleWriter)(iw)) // bounds nothing; the handler's write_timeout reads it
		if st != nil {
			gw.SetOwner(st) // the handler and policy behind find st there
		}
	}
	err := next.ServeHTTP(gw, r)
	if err == nil {
		reuse = true
		return nil
	}
	if gw.Responded() {
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
	edge.Write(gw, ae)
	return nil
}

// readBody reads the body once, bounded, into ramjet's per-request state
// st, which ServeHTTP found or created when there is a body (the policy
// then fingerprints the same bytes without reading again; the proxy
// forwards them byte for byte and can replay them on a retry), and
// validates it on JSON routes (by its Content-Type ctype).
func (g *Guard) readBody(r *http.Request, st *reqState, ctype string) *edge.Error {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	if r.ContentLength > g.MaxBodySize {
		return edge.TooLarge(g.MaxBodySize)
	}
	st.readBody(r, g.MaxBodySize)
	if st.bodyErr != nil || st.body == nil { // both map a nil error to none: not called then
		if edge.BodyTimedOut(st.bodyErr) {
			return edge.BodyTimeout()
		}
		return edge.ReadError(st.bodyErr, g.MaxBodySize)
	}
	ep, parse, ae := edge.BodyRoute(r.Method, r.URL.Path, ctype)
	if !parse {
		return ae
	}
	b := st.acquireBody()
	if b == nil {
		return nil // the request already ended
	}
	defer b.Release()
	// The one parse of this body: the matcher and the policy reuse it.
	f, err := st.parse(sharedExtractor(), ep)
	if err != nil {
		return edge.FromRequestError(err)
	}
	if len(f.Model) > 0 && g.checkOn && g.fleet != nil {
		model := modelNames.Intern(f.Model) // the held name: no copy for the models in use
		st.model = model                    // Select's for the observers: not interned twice
		if known, listed := g.fleet.Knows(r.Context(), model); listed && !known {
			return edge.ModelNotFound(model)
		}
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Guard)(nil)
	_ caddy.Validator             = (*Guard)(nil) // edge.GuardSettings.Validate
	_ caddy.CleanerUpper          = (*Guard)(nil)
	_ caddyhttp.MiddlewareHandler = (*Guard)(nil)
	_ caddyfile.Unmarshaler       = (*Guard)(nil)
)

// newClientAuth is the client key check of spec: comma- or space-separated
// keys, placeholders resolved.
func newClientAuth(spec string) edge.ClientAuth {
	return edge.NewClientAuth(caddyblock.SplitList([]string{resolveSecret(spec)}))
}

// apiErrorFromHandler turns an error returned by the rest of the handler
// chain (reverse_proxy and friends) into the OpenAI-shaped error the client
// sees. The original error text is never shown: it may carry an upstream
// address (Caddy's "dial tcp 10.0.0.5:8000: connection refused").
func apiErrorFromHandler(err error) *edge.Error {
	var ae *edge.Error
	if errors.As(err, &ae) {
		return ae
	}
	return edge.FromStatus(errStatus(err))
}
