package module

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/dashboard"
	"github.com/ramjet-llm/ramjet/metrics"
)

func init() {
	caddy.RegisterModule(Dashboard{})
	registerHandler[Dashboard]("ramjet_dashboard", httpcaddyfile.After, "metrics")
}

// Defaults of the dashboard.
const (
	// DefaultSampleInterval is how often the dashboard samples the metrics.
	DefaultSampleInterval = 2 * time.Second
	// historyLen is how many samples the dashboard keeps (10 minutes at the
	// default interval).
	historyLen = 300
)

// Dashboard serves ramjet's built-in dashboard (module
// http.handlers.ramjet_dashboard, package dashboard): one page with its
// scripts and styles embedded in the binary, and the JSON it polls
// (data.json, the same as the admin API's GET /ramjet/dashboard/data). Put
// it on the ops port next to Caddy's metrics handler:
//
//	:9090 {
//		metrics /metrics
//		ramjet_dashboard
//	}
//
// It answers every request it sees: the page for a path ending in "/",
// data.json, and the assets under assets/; anything else is 404. The page
// uses relative links, so it works under any path prefix (handle_path).
type Dashboard struct {
	// SampleInterval is how often the metrics are sampled for the charts.
	// The dashboard keeps 300 samples. Default: 2s.
	SampleInterval caddy.Duration `json:"sample_interval,omitempty"`

	hist    *history
	poolKey string
}

// CaddyModule returns the Caddy module information.
func (Dashboard) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.ramjet_dashboard",
		New: func() caddy.Module { return new(Dashboard) },
	}
}

// UnmarshalCaddyfile sets up the dashboard from Caddyfile tokens. Syntax:
//
//	ramjet_dashboard [<matcher>] {
//		sample_interval <duration>
//	}
func (d *Dashboard) UnmarshalCaddyfile(disp *caddyfile.Dispenser) error {
	return optionBlock(disp, "ramjet_dashboard", d, nil)
}

// Provision registers the metrics and joins (or starts) the sampler.
func (d *Dashboard) Provision(ctx caddy.Context) error {
	if d.SampleInterval == 0 {
		d.SampleInterval = caddy.Duration(DefaultSampleInterval)
	}
	if err := d.Validate(); err != nil {
		return err
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	h, key, err := acquireHistory(time.Duration(d.SampleInterval))
	if err != nil {
		return err
	}
	d.hist, d.poolKey = h, key
	return nil
}

// Validate rejects bad values, naming the field.
func (d *Dashboard) Validate() error {
	if iv := time.Duration(d.SampleInterval); iv < 100*time.Millisecond || iv > time.Hour {
		return fmt.Errorf("sample_interval must be between 100ms and 1h, got %v", iv)
	}
	return nil
}

// Cleanup drops the dashboard's hold on the sampler.
func (d *Dashboard) Cleanup() error {
	if d.hist == nil {
		return nil
	}
	d.hist = nil
	_, err := histories.Delete(d.poolKey)
	return err
}

// ServeHTTP serves the page, its assets and data.json.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	dashboard.Handler{Data: d.hist.data}.ServeHTTP(w, r)
	return nil
}

// histories holds the sampler shared by every dashboard of one sample
// interval, so that the charts' history survives config reloads.
var histories = caddy.NewUsagePool()

// liveHistory is the sampler most recently started, for the admin API.
var liveHistory atomic.Pointer[history]

// history is a dashboard.Store of the process's metric set, kept in the
// histories pool.
type history struct{ *dashboard.Store }

func newHistory(m *metrics.Set, interval time.Duration, n int) *history {
	return &history{dashboard.NewStore(interval, n, m.DashboardSample)}
}

// data is the page's JSON now, with the recent decisions.
func (h *history) data(now time.Time) dashboard.Data {
	return h.Data(now, processMetrics().RecentRecords())
}

// Destruct stops the sampler (the last dashboard using it was cleaned up).
func (h *history) Destruct() error {
	liveHistory.CompareAndSwap(h, nil)
	return h.Close()
}

func acquireHistory(interval time.Duration) (*history, string, error) {
	key := "ramjet/dashboard/" + interval.String()
	v, _, err := histories.LoadOrNew(key, func() (caddy.Destructor, error) {
		h := newHistory(processMetrics(), interval, historyLen)
		h.Start()
		return h, nil
	})
	if err != nil {
		return nil, "", err
	}
	h := v.(*history)
	liveHistory.Store(h)
	return h, key, nil
}

// currentHistory is the live sampler or nil.
func currentHistory() *history { return liveHistory.Load() }

// Interface guards.
var (
	_ caddy.Provisioner           = (*Dashboard)(nil)
	_ caddy.Validator             = (*Dashboard)(nil)
	_ caddy.CleanerUpper          = (*Dashboard)(nil)
	_ caddyhttp.MiddlewareHandler = (*Dashboard)(nil)
	_ caddyfile.Unmarshaler       = (*Dashboard)(nil)
	_ caddy.Destructor            = (*history)(nil)
)
