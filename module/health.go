package module

import (
	"errors"
	"net/http"
	"slices"
	"sort"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/ramjet-llm/ramjet/caddyblock"
	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/fleetstate"
)

func init() {
	caddy.RegisterModule(Health{})
	registerHandler[Health]("ramjet_health", httpcaddyfile.Before, "reverse_proxy")
}

// Health answers GET /health on the client port (module
// http.handlers.ramjet_health) with the state of the replicas behind a
// ramjet reverse_proxy, as Caddy itself sees them: a replica is out when
// Caddy's active health check marks it down, when its passive failures
// reached max_fails, or when its circuit breaker is open
// (reverseproxy.Upstream.Healthy). The answer:
//
//	{"status":"ok"|"degraded"|"unhealthy","healthy":2,"total":3,
//	 "replicas":[{"id":"9c1f…","healthy":true,"reason":"","in_flight":0}, …]}
//
// status is ok when every replica is usable, degraded when some are out and
// unhealthy (HTTP 503) when none is. Replicas are named by their opaque
// route id (the X-Ramjet-Upstream value), never by address.
//
// The handler reads the Upstream values of the reverse_proxy handler in the
// same http app whose upstream list equals Upstreams (the ramjet directive
// sets both), so it reflects exactly the health state that routing uses.
type Health struct {
	// Upstreams are the dial addresses of the replicas, in the order of the
	// reverse_proxy's upstream list, a data-parallel engine repeated once
	// per rank.
	Upstreams []string `json:"upstreams,omitempty"`

	// RouteIDSecret keys the opaque replica ids when the proxy does not use
	// the ramjet policy; with the ramjet policy, its ids (and secret) are
	// used, so that /health ids match X-Ramjet-Upstream. Placeholders such
	// as {env.RJ_ROUTE_ID_SECRET} are resolved at provisioning.
	RouteIDSecret string `json:"route_id_secret,omitempty"`

	secret string
	ids    []string
	finder *proxyFinder
}

// CaddyModule returns the Caddy module information.
func (Health) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.ramjet_health",
		New: func() caddy.Module { return new(Health) },
	}
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	ramjet_health <upstreams...> {
//	    route_id_secret <secret>
//	}
func (h *Health) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	h.Upstreams = append(h.Upstreams, caddyblock.SplitList(d.RemainingArgs())...)
	b := &caddyblock.Block{Name: "ramjet_health", Line: true}
	return b.Parse(d, h)
}

// Provision computes the replica ids.
func (h *Health) Provision(ctx caddy.Context) error {
	if err := CheckRetiredEnv(); err != nil {
		return err
	}
	h.finder = &proxyFinder{ctx: ctx}
	h.secret = resolveSecret(h.RouteIDSecret)
	h.ids = fleetstate.ReplicaIDs([]byte(h.secret), h.Upstreams)
	return nil
}

// Validate requires upstreams.
func (h *Health) Validate() error {
	if len(h.Upstreams) == 0 {
		return errors.New("upstreams: at least one upstream is required")
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler. It answers every request
// it sees; the route in front of it should match GET /health.
func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		edge.Write(w, edge.NewError(http.StatusMethodNotAllowed, edge.TypeInvalidRequest, "method_not_allowed", "",
			"only GET is allowed on "+r.URL.Path))
		return nil
	}
	if err := h.Report().Write(w, r); err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	return nil
}

// Report builds the health answer from the live Upstream values
// (fleetstate.HealthOf).
func (h *Health) Report() fleetstate.HealthReport {
	proxy := h.findProxy()
	var ups []fleetstate.UpstreamHealth
	if proxy != nil {
		ups = make([]fleetstate.UpstreamHealth, len(proxy.Upstreams))
		for i, u := range proxy.Upstreams {
			ups[i] = fleetstate.UpstreamHealth{Healthy: u.Healthy(), InFlight: u.NumRequests(), Full: u.Full()}
			if !ups[i].Healthy {
				ups[i].Out = outReason(proxy, u)
			}
		}
	}
	f := policyFleet(proxy)
	var base *fleetstate.Fleet
	if f != nil {
		base = f.Fleet
	}
	integ := func(key string) *fleetstate.IntegrityReport { return integrityStatus(f, key) } // integrity.go
	return fleetstate.HealthOf(h.Upstreams, h.ids, ups, base, integ, kvFeeds(f))             // kvmetrics.go
}

// policyFleet returns the fleet of the proxy's ramjet policy, or nil when
// the proxy does not use the policy.
func policyFleet(proxy *reverseproxy.Handler) *fleet {
	if proxy == nil || proxy.LoadBalancing == nil {
		return nil
	}
	if pol, ok := proxy.LoadBalancing.SelectionPolicy.(*RamjetSelection); ok {
		return pol.fleet
	}
	return nil
}

// outReason tells which of Caddy's health mechanisms holds u out.
func outReason(proxy *reverseproxy.Handler, u *reverseproxy.Upstream) string {
	if hc := proxy.HealthChecks; hc != nil && hc.Passive != nil && hc.Passive.MaxFails > 0 &&
		u.Fails() >= hc.Passive.MaxFails {
		return "passive_failures"
	}
	if hc := proxy.HealthChecks; hc != nil && hc.Active != nil {
		return "active_check"
	}
	return "circuit_breaker"
}

// findProxy finds the reverse_proxy handler whose upstream list equals
// ours (once per config).
func (h *Health) findProxy() *reverseproxy.Handler {
	return h.finder.find(func(ups reverseproxy.UpstreamPool) bool { return slices.Equal(dialsOf(ups), h.Upstreams) })
}

// proxyFinder finds, once per config, a provisioned reverse_proxy handler in
// the same http app. It runs at request time: during provisioning the http
// app is not complete yet.
type proxyFinder struct {
	ctx   caddy.Context
	mu    sync.Mutex
	proxy *reverseproxy.Handler
}

func (pf *proxyFinder) find(match func(reverseproxy.UpstreamPool) bool) *reverseproxy.Handler {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	if pf.proxy != nil {
		return pf.proxy
	}
	app, err := pf.ctx.AppIfConfigured("http")
	if err != nil {
		return nil
	}
	httpApp, ok := app.(*caddyhttp.App)
	if !ok {
		return nil
	}
	names := make([]string, 0, len(httpApp.Servers))
	for name := range httpApp.Servers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		srv := httpApp.Servers[name]
		if p := findProxyIn(srv.Routes, match, 0); p != nil {
			pf.proxy = p
			return p
		}
		if srv.Errors != nil {
			if p := findProxyIn(srv.Errors.Routes, match, 0); p != nil {
				pf.proxy = p
				return p
			}
		}
	}
	return nil
}

// findProxyIn walks routes and subroutes (bounded depth) for a
// reverse_proxy whose upstreams match.
func findProxyIn(routes caddyhttp.RouteList, match func(reverseproxy.UpstreamPool) bool, depth int) *reverseproxy.Handler {
	if depth > 16 {
		return nil
	}
	for _, rt := range routes {
		for _, mh := range rt.Handlers {
			switch v := mh.(type) {
			case *reverseproxy.Handler:
				if match(v.Upstreams) {
					return v
				}
			case *caddyhttp.Subroute:
				if p := findProxyIn(v.Routes, match, depth+1); p != nil {
					return p
				}
			}
		}
	}
	return nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Health)(nil)
	_ caddy.Validator             = (*Health)(nil)
	_ caddyhttp.MiddlewareHandler = (*Health)(nil)
	_ caddyfile.Unmarshaler       = (*Health)(nil)
)
