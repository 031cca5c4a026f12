package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ramjet-llm/ramjet/fleetstate"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI adds ramjet's routes to Caddy's admin API (module
// admin.api.ramjet; like all of the admin API it listens on localhost
// unless configured otherwise):
//
//	GET  /ramjet/fleet[?fleet=<state_key>]
//	     every replica by opaque id with its load, pending prefill and
//	     health, and the index's size against its budget.
//	POST /ramjet/explain[?fleet=<state_key>][&path=/v1/chat/completions]
//	     body: an OpenAI request body. The score of every replica (overlap,
//	     capped overlap, load, score) and the decision the policy would
//	     make now, with the rule that decided a tie. Nothing is sent,
//	     reserved or learned.
//	GET  /ramjet/dashboard/data
//	     the dashboard's JSON (see the ramjet_dashboard handler).
//
// Caddy loads every admin.api module with each config, so the module needs
// no configuration; it also registers the ramjet_* metrics into the
// config's registry, which the admin API serves at /metrics.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.ramjet",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Provision registers the ramjet metrics into the config's registry.
func (a *AdminAPI) Provision(ctx caddy.Context) error {
	return registerMetrics(ctx.GetMetricsRegistry())
}

// Routes returns the admin routes.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/ramjet/fleet", Handler: caddy.AdminHandlerFunc(a.handleFleet)},
		{Pattern: "/ramjet/explain", Handler: caddy.AdminHandlerFunc(a.handleExplain)},
		{Pattern: "/ramjet/dashboard/data", Handler: caddy.AdminHandlerFunc(a.handleDashboardData)},
	}
}

// maxExplainBody bounds the body POST /ramjet/explain reads.
const maxExplainBody = DefaultMaxBodyBytes

func (a *AdminAPI) handleFleet(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	want := r.URL.Query().Get("fleet")
	out, ok := fleetstate.FleetsOf(snapshotFleets(), want)
	if !ok {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no live fleet %q", want)}
	}
	for i := range out.Fleets {
		out.Fleets[i].Engines = engineStatesOf(out.Fleets[i].Fleet)
	}
	return writeAdminJSON(w, out)
}

func (a *AdminAPI) handleExplain(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	name := r.URL.Query().Get("fleet")
	f := lookupFleet(name)
	if f == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no live fleet %q", name)}
	}
	ep, body, status, err := fleetstate.ReadExplain(w, r, maxExplainBody)
	if err != nil {
		return caddy.APIError{HTTPStatus: status, Err: err}
	}
	ex, err := fleetstate.Explain(f.Router(), f.snapshot(), ep, body)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	ex.Session = explainSession(f, r, ex.Decision.Upstream) // integrity.go
	return writeAdminJSON(w, ex)
}

func (a *AdminAPI) handleDashboardData(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	h := currentHistory()
	if h == nil {
		// No dashboard is configured: serve current totals from a
		// one-off history without a sampler.
		h = newHistory(processMetrics(), DefaultSampleInterval, 1)
	}
	return writeAdminJSON(w, h.data(time.Now()))
}

func writeAdminJSON(w http.ResponseWriter, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("encoding JSON: %w", err)}
	}
	w.Header().Set("Content-Type", "application/json")
	_, err = w.Write(append(b, '\n'))
	return err
}

// Interface guards.
var (
	_ caddy.Provisioner = (*AdminAPI)(nil)
	_ caddy.AdminRouter = (*AdminAPI)(nil)
)
