package module

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/ramjet-llm/ramjet/caddyblock"
	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/edge"
)

func init() {
	caddy.RegisterModule(Models{})
	registerHandler[Models]("ramjet_models", httpcaddyfile.Before, "reverse_proxy")
}

// Models answers GET /v1/models (and GET /v1/models/{id}) for a ramjet route
// (module http.handlers.ramjet_models): it asks every engine for its model
// list, in parallel and with a timeout, merges and de-duplicates them, and
// rewrites the metadata so that no engine filesystem path (vLLM's "root"),
// host or port leaks. Kept per model: id, object, created, owned_by,
// max_model_len, and parent when the parent is itself a listed model (a
// LoRA adapter's base). The merged list is cached briefly and shared with
// the ramjet_guard of the same upstreams (its unknown-model check).
type Models struct {
	// Engines are the engines (a repeated address, a data-parallel rank,
	// is asked once), the token sent to them and the client keys checked.
	Engines

	// The handler's own settings: timeout and cache (see
	// catalog.Settings).
	catalog.Settings

	finder *proxyFinder
}

// Engines is what ramjet_guard and ramjet_models share: the engines of a
// route, the token sent to them, the API keys clients must present, and
// the model catalogue of those engines (shared by every handler of the
// same upstreams and token, released by Cleanup).
type Engines struct {
	// Upstreams are the dial addresses (host:port, or https://host:port)
	// of the engines behind this route. They are used to learn the fleet's
	// models and to keep these addresses out of response headers.
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

	token  string
	auth   edge.ClientAuth
	fleet  *catalog.Catalog
	fleetK string
}

// parse reads the Caddyfile of a handler of the engines (ramjet_guard,
// ramjet_models: v embeds e): its upstreams, then its block of v's
// options, line-form (an option without a value keeps its default).
// client_tokens takes several keys (comma-joined).
func (e *Engines) parse(d *caddyfile.Dispenser, directive string, v any) error {
	d.Next() // directive name
	e.Upstreams = append(e.Upstreams, caddyblock.SplitList(d.RemainingArgs())...)
	b := &caddyblock.Block{Name: directive, Line: true,
		Check: map[string]func(string) (string, error){"model_check": catalog.ParseModelCheck},
		Custom: map[string]func(*caddyfile.Dispenser) error{"client_tokens": func(d *caddyfile.Dispenser) error {
			e.ClientTokens = strings.Join(d.RemainingArgs(), ",")
			return nil
		}}}
	return b.Parse(d, v)
}

// provision resolves the token and the client keys and, when catalogue
// is set, joins the shared model catalogue of the upstreams.
func (e *Engines) provision(timeout time.Duration, catalogue bool) error {
	if err := CheckRetiredEnv(); err != nil {
		return err
	}
	e.token = resolveSecret(e.UpstreamToken)
	e.auth = newClientAuth(e.ClientTokens)
	if !catalogue {
		return nil
	}
	f, key, err := acquireModelList(e.Upstreams, e.token, timeout)
	if err != nil {
		return err
	}
	e.fleet, e.fleetK = f, key
	return nil
}

// Cleanup releases the shared model catalogue.
func (e *Engines) Cleanup() error {
	if e.fleet != nil {
		_, _ = modelLists.Delete(e.fleetK)
	}
	return nil
}

// CaddyModule returns the Caddy module information.
func (Models) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.ramjet_models",
		New: func() caddy.Module { return new(Models) },
	}
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	ramjet_models <upstreams...> {
//	    upstream_token <token>
//	    client_tokens  <keys...>
//	    timeout        <duration>
//	    cache          <duration>
//	}
func (m *Models) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return m.parse(d, "ramjet_models", m)
}

// Provision fills defaults and joins the shared model list.
func (m *Models) Provision(ctx caddy.Context) error {
	m.SetDefaults()
	m.finder = &proxyFinder{ctx: ctx}
	return m.provision(time.Duration(m.Timeout), true)
}

// Validate rejects bad values, naming the field.
func (m *Models) Validate() error {
	if len(m.Upstreams) == 0 {
		return errors.New("upstreams: at least one upstream is required")
	}
	return m.Settings.Validate()
}

// ServeHTTP implements caddyhttp.MiddlewareHandler. It answers every request
// it sees; the route in front of it should match GET /v1/models*.
func (m *Models) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if ae := m.auth.Check(r); ae != nil {
		edge.Write(w, ae)
		return nil
	}
	if err := m.fleet.Serve(w, r, time.Duration(m.Cache), m.healthy()); err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	return nil
}

// healthy returns the dial addresses Caddy currently holds usable, from the
// reverse_proxy over the same engines, or nil (ask every engine) when there
// is no such proxy or none is usable.
func (m *Models) healthy() map[string]bool {
	proxy := m.finder.find(func(ups reverseproxy.UpstreamPool) bool { return catalog.Covers(m.Upstreams, dialsOf(ups)) })
	if proxy == nil {
		return nil
	}
	ok := map[string]bool{}
	for _, u := range proxy.Upstreams {
		if u.Healthy() {
			ok[u.Dial] = true
		}
	}
	if len(ok) == 0 {
		return nil
	}
	return ok
}

// fleetModels is the catalogue of one set of engines, shared through the
// modelLists pool by every handler of the same upstreams and token, so that
// a config reload keeps it.
type fleetModels struct{ *catalog.Catalog }

// Destruct closes idle connections when the last handler lets go.
func (f fleetModels) Destruct() error { return f.Close() }

var modelLists = caddy.NewUsagePool()

// acquireModelList returns the shared catalogue of these upstreams,
// creating it on first use. The caller must modelLists.Delete(key) in
// Cleanup.
func acquireModelList(upstreams []string, token string, timeout time.Duration) (*catalog.Catalog, string, error) {
	key := catalog.Key(upstreams, token, timeout)
	v, _, err := modelLists.LoadOrNew(key, func() (caddy.Destructor, error) {
		c, err := catalog.New(upstreams, token, timeout)
		return fleetModels{c}, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("model list: %w", err)
	}
	return v.(fleetModels).Catalog, key, nil
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Models)(nil)
	_ caddy.Validator             = (*Models)(nil)
	_ caddy.CleanerUpper          = (*Models)(nil)
	_ caddyhttp.MiddlewareHandler = (*Models)(nil)
	_ caddyfile.Unmarshaler       = (*Models)(nil)
	_ caddy.Destructor            = fleetModels{}
)
