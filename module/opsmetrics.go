package module

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/metrics"
)

func init() {
	caddy.RegisterModule(OpsMetrics{})
	registerHandler[OpsMetrics]("ramjet_metrics", httpcaddyfile.Before, "metrics")
}

// OpsMetrics serves the config's Prometheus registry as Caddy's `metrics`
// handler does, minus the series that name engine addresses: Caddy's
// reverse-proxy families (`caddy_reverse_proxy_*`, today
// `caddy_reverse_proxy_upstreams_healthy{upstream="<dial address>"}`).
// The same health state is in `ramjet_upstream_healthy`, labelled with
// route ids. Everything else (the ramjet_* series, Caddy's HTTP, admin,
// process and Go series) is served unchanged (metrics.WithoutAddresses).
//
// Caddyfile:
//
//	ramjet_metrics [<matcher>] {
//	    disable_openmetrics
//	}
type OpsMetrics struct {
	// Disable OpenMetrics negotiation (enabled by default), as in Caddy's
	// metrics handler.
	DisableOpenMetrics bool `json:"disable_openmetrics,omitempty"`

	handler http.Handler
}

// CaddyModule returns the Caddy module information.
func (OpsMetrics) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.ramjet_metrics",
		New: func() caddy.Module { return new(OpsMetrics) },
	}
}

// UnmarshalCaddyfile reads `ramjet_metrics [{ disable_openmetrics }]`.
func (m *OpsMetrics) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return optionBlock(d, "ramjet_metrics", m, nil)
}

// Provision builds the handler over the config's metrics registry.
func (m *OpsMetrics) Provision(ctx caddy.Context) error {
	registry := ctx.GetMetricsRegistry()
	if registry == nil {
		return errors.New("ramjet_metrics: no metrics registry")
	}
	m.handler = promhttp.InstrumentMetricHandler(registry, promhttp.HandlerFor(metrics.WithoutAddresses(registry), promhttp.HandlerOpts{
		ErrorLog:          zap.NewStdLog(ctx.Logger()),
		EnableOpenMetrics: !m.DisableOpenMetrics,
	}))
	return nil
}

// ServeHTTP answers the scrape.
func (m *OpsMetrics) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	m.handler.ServeHTTP(w, r)
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*OpsMetrics)(nil)
	_ caddyhttp.MiddlewareHandler = (*OpsMetrics)(nil)
	_ caddyfile.Unmarshaler       = (*OpsMetrics)(nil)
)
