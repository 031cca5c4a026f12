package module

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	dto "github.com/prometheus/client_model/go"
)

func init() {
	caddy.RegisterModule(Dashboard{})
	httpcaddyfile.RegisterHandlerDirective("ramjet_dashboard", parseDashboardCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("ramjet_dashboard", httpcaddyfile.After, "metrics")
}

//go:embed dashboard/index.html dashboard/dashboard.js dashboard/dashboard.css dashboard/vendor/uplot/uPlot.iife.min.js dashboard/vendor/uplot/uPlot.min.css dashboard/vendor/uplot/LICENSE
var dashboardFS embed.FS

// Defaults of the dashboard.
const (
	// DefaultSampleInterval is how often the dashboard samples the metrics.
	DefaultSampleInterval = 2 * time.Second
	// historyLen is how many samples the dashboard keeps (10 minutes at the
	// default interval).
	historyLen = 300
	// recentLen is how many recent routing decisions the dashboard keeps.
	recentLen = 200
)

// Dashboard serves ramjet's built-in dashboard (module
// http.handlers.ramjet_dashboard): one page with its scripts and styles
// embedded in the binary (no CDN, nothing built at run time), and the JSON
// it polls (data.json, the same as the admin API's
// GET /ramjet/dashboard/data). Put it on the ops port next to Caddy's
// metrics handler:
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
	disp.Next()
	if disp.NextArg() {
		return disp.ArgErr()
	}
	for disp.NextBlock(0) {
		switch disp.Val() {
		case "sample_interval":
			if d.SampleInterval != 0 {
				return disp.Errf("sample_interval: option specified more than once")
			}
			if !disp.NextArg() {
				return disp.Errf("sample_interval: missing value")
			}
			v, err := caddy.ParseDuration(disp.Val())
			if err != nil {
				return disp.Errf("sample_interval: %v", err)
			}
			if disp.NextArg() {
				return disp.Errf("sample_interval: too many values")
			}
			d.SampleInterval = caddy.Duration(v)
		default:
			return disp.Errf("unrecognized ramjet_dashboard option '%s'", disp.Val())
		}
	}
	return nil
}

func parseDashboardCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var d Dashboard
	err := d.UnmarshalCaddyfile(h.Dispenser)
	return &d, err
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

// dashboardAssets maps the names under assets/ to embedded files and
// their content types.
var dashboardAssets = map[string]struct{ file, ctype string }{
	"dashboard.js":      {"dashboard/dashboard.js", "text/javascript; charset=utf-8"},
	"dashboard.css":     {"dashboard/dashboard.css", "text/css; charset=utf-8"},
	"uPlot.iife.min.js": {"dashboard/vendor/uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"},
	"uPlot.min.css":     {"dashboard/vendor/uplot/uPlot.min.css", "text/css; charset=utf-8"},
	"uPlot-LICENSE":     {"dashboard/vendor/uplot/LICENSE", "text/plain; charset=utf-8"},
}

// ServeHTTP serves the page, its assets and data.json.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("dashboard: method %s not allowed", r.Method))
	}
	p := r.URL.Path
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	switch {
	case p == "" || strings.HasSuffix(p, "/"):
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
		return serveEmbedded(w, "dashboard/index.html", "text/html; charset=utf-8")
	case path.Base(p) == "data.json":
		h.Set("Cache-Control", "no-store")
		return writeJSON(w, d.hist.data(time.Now()))
	case path.Base(path.Dir(p)) == "assets":
		if a, ok := dashboardAssets[path.Base(p)]; ok {
			return serveEmbedded(w, a.file, a.ctype)
		}
	}
	return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("dashboard: no such page %q", p))
}

func serveEmbedded(w http.ResponseWriter, name, ctype string) error {
	b, err := fs.ReadFile(dashboardFS, name)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("dashboard asset %s: %w", name, err))
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", "no-cache")
	_, err = w.Write(b)
	return err
}

func writeJSON(w http.ResponseWriter, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("encoding JSON: %w", err))
	}
	w.Header().Set("Content-Type", "application/json")
	_, err = w.Write(append(b, '\n'))
	return err
}

// histories holds the sampler shared by every dashboard of one sample
// interval, so that the charts' history survives config reloads.
var histories = caddy.NewUsagePool()

// liveHistory is the sampler most recently started, for the admin API.
var liveHistory struct {
	sync.Mutex
	h *history
}

func acquireHistory(interval time.Duration) (*history, string, error) {
	key := "ramjet/dashboard/" + interval.String()
	v, _, err := histories.LoadOrNew(key, func() (caddy.Destructor, error) {
		h := newHistory(metrics(), interval, historyLen)
		h.start()
		return h, nil
	})
	if err != nil {
		return nil, "", err
	}
	h := v.(*history)
	liveHistory.Lock()
	liveHistory.h = h
	liveHistory.Unlock()
	return h, key, nil
}

// currentHistory is the live sampler or nil.
func currentHistory() *history {
	liveHistory.Lock()
	defer liveHistory.Unlock()
	return liveHistory.h
}

// history samples a metricSet at a fixed interval and keeps the last n
// samples. The sampler goroutine is owned by the history: start starts
// it, Destruct (the last dashboard using it was cleaned up) stops it.
type history struct {
	m        *metricSet
	interval time.Duration

	mu      sync.Mutex
	samples []sample // ring, oldest at head
	head    int
	count   int

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newHistory(m *metricSet, interval time.Duration, n int) *history {
	return &history{m: m, interval: interval, samples: make([]sample, n)}
}

func (h *history) start() {
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.done)
		h.sample(time.Now())
		t := time.NewTicker(h.interval)
		defer t.Stop()
		for {
			select {
			case now := <-t.C:
				h.sample(now)
			case <-h.stop:
				return
			}
		}
	}()
}

// Destruct stops the sampler and waits for it.
func (h *history) Destruct() error {
	h.once.Do(func() {
		if h.stop != nil {
			close(h.stop)
			<-h.done
		}
	})
	liveHistory.Lock()
	if liveHistory.h == h {
		liveHistory.h = nil
	}
	liveHistory.Unlock()
	return nil
}

// counts are cumulative counters of one sample, for one group (all, one
// upstream, one model).
type counts struct {
	Requests, Errors       float64
	Prompt, Cached, Output float64
}

type upSample struct {
	counts
	Fleet                          string
	Inflight, Pending, Load        float64
	Healthy, Available, Quarantine bool
	Reasons                        map[string]float64
}

type modelSample struct {
	counts
	Inflight float64
}

// sample is the state of the metrics at one instant: cumulative counters
// (rates are computed between samples) and gauges.
type sample struct {
	T           time.Time
	All         counts
	TTFT        []float64 // cumulative bucket counts, merged over upstreams
	TTFTBounds  []float64
	Reasons     map[string]float64
	Up          map[string]*upSample
	Model       map[string]*modelSample
	IndexBytes  float64
	IndexBudget float64
	IndexItems  float64
}

// sample gathers the metric set now and appends the result.
func (h *history) sample(now time.Time) {
	s := h.m.snapshot(now)
	h.mu.Lock()
	defer h.mu.Unlock()
	i := (h.head + h.count) % len(h.samples)
	if h.count == len(h.samples) {
		h.head = (h.head + 1) % len(h.samples)
	} else {
		h.count++
	}
	h.samples[i] = s
}

// snapshot reads every ramjet series of m.
func (m *metricSet) snapshot(now time.Time) sample {
	s := sample{T: now, Reasons: map[string]float64{}, Up: map[string]*upSample{}, Model: map[string]*modelSample{}}
	// On an error Gather still returns what it could gather: chart that.
	mfs, _ := m.own.Gather()
	up := func(id string) *upSample {
		u := s.Up[id]
		if u == nil {
			u = &upSample{Reasons: map[string]float64{}}
			s.Up[id] = u
		}
		return u
	}
	model := func(name string) *modelSample {
		if name == "" {
			name = "unknown"
		}
		x := s.Model[name]
		if x == nil {
			x = &modelSample{}
			s.Model[name] = x
		}
		return x
	}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			l := labelMap(mt)
			switch mf.GetName() {
			case "ramjet_requests_total":
				v := mt.GetCounter().GetValue()
				isErr := l["outcome"] != OutcomeOK
				add := func(c *counts) {
					c.Requests += v
					if isErr {
						c.Errors += v
					}
				}
				add(&s.All)
				add(&model(l["model"]).counts)
				if id := l["upstream"]; id != "" {
					add(&up(id).counts)
				}
			case "ramjet_prompt_tokens_total", "ramjet_cached_prompt_tokens_total", "ramjet_completion_tokens_total":
				v := mt.GetCounter().GetValue()
				pick := func(c *counts) *float64 {
					switch mf.GetName() {
					case "ramjet_prompt_tokens_total":
						return &c.Prompt
					case "ramjet_cached_prompt_tokens_total":
						return &c.Cached
					}
					return &c.Output
				}
				*pick(&s.All) += v
				*pick(&model(l["model"]).counts) += v
				*pick(&up(l["upstream"]).counts) += v
			case "ramjet_routing_decisions_total":
				v := mt.GetCounter().GetValue()
				s.Reasons[l["reason"]] += v
				if id := l["upstream"]; id != "" {
					up(id).Reasons[l["reason"]] += v
				}
			case "ramjet_time_to_first_token_seconds":
				// The buckets plus +Inf (the sample count).
				hg := mt.GetHistogram()
				bs := hg.GetBucket()
				if s.TTFT == nil {
					s.TTFT = make([]float64, len(bs)+1)
					s.TTFTBounds = make([]float64, len(bs)+1)
					for i, b := range bs {
						s.TTFTBounds[i] = b.GetUpperBound()
					}
					s.TTFTBounds[len(bs)] = math.Inf(1)
				}
				if len(bs)+1 == len(s.TTFT) {
					for i, b := range bs {
						s.TTFT[i] += float64(b.GetCumulativeCount())
					}
					s.TTFT[len(bs)] += float64(hg.GetSampleCount())
				}
			case "ramjet_model_inflight_requests":
				model(l["model"]).Inflight += mt.GetGauge().GetValue()
			case "ramjet_upstream_inflight_requests":
				u := up(l["upstream"])
				u.Fleet = l["fleet"]
				u.Inflight += mt.GetGauge().GetValue()
			case "ramjet_upstream_pending_prefill_tokens":
				up(l["upstream"]).Pending += mt.GetGauge().GetValue()
			case "ramjet_upstream_load_tokens":
				up(l["upstream"]).Load += mt.GetGauge().GetValue()
			case "ramjet_upstream_healthy":
				up(l["upstream"]).Healthy = mt.GetGauge().GetValue() > 0
			case "ramjet_upstream_available":
				up(l["upstream"]).Available = mt.GetGauge().GetValue() > 0
			case "ramjet_upstream_quarantined":
				up(l["upstream"]).Quarantine = mt.GetGauge().GetValue() > 0
			case "ramjet_index_bytes":
				s.IndexBytes += mt.GetGauge().GetValue()
			case "ramjet_index_budget_bytes":
				s.IndexBudget += mt.GetGauge().GetValue()
			case "ramjet_index_entries":
				s.IndexItems += mt.GetGauge().GetValue()
			}
		}
	}
	// Models with no traffic left and nothing in flight are dropped.
	for k, x := range s.Model {
		if x.Requests == 0 && x.Inflight == 0 {
			delete(s.Model, k)
		}
	}
	return s
}

func labelMap(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// ordered returns the samples oldest first.
func (h *history) ordered() []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]sample, h.count)
	for i := range h.count {
		out[i] = h.samples[(h.head+i)%len(h.samples)]
	}
	return out
}

// num is a float that encodes NaN as JSON null (a gap in a chart).
type num float64

func (n num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(math.Round(f*1000) / 1000)
}

// rateSeries are the rates of one group between consecutive samples.
type rateSeries struct {
	RPS         []num `json:"rps"`
	EPS         []num `json:"eps"`
	OutputTPS   []num `json:"output_tps"`
	CachedShare []num `json:"cached_share"`
}

// dashboardData is the JSON the dashboard polls.
type dashboardData struct {
	Now             int64              `json:"now"`
	IntervalSeconds float64            `json:"interval_seconds"`
	T               []num              `json:"t"`
	System          rateSeries         `json:"system"`
	TTFTP50         []num              `json:"ttft_p50"`
	TTFTP95         []num              `json:"ttft_p95"`
	Reasons         map[string][]num   `json:"reasons"`
	IndexBytes      []num              `json:"index_bytes"`
	IndexBudget     []num              `json:"index_budget"`
	IndexEntries    []num              `json:"index_entries"`
	Upstreams       []upstreamData     `json:"upstreams"`
	Models          []modelData        `json:"models"`
	Totals          totalsData         `json:"totals"`
	Health          healthData         `json:"health"`
	Recent          []decisionRecord   `json:"recent"`
	ReasonTotals    map[string]float64 `json:"reason_totals"`
}

type totalsData struct {
	Requests    float64 `json:"requests"`
	Errors      float64 `json:"errors"`
	Prompt      float64 `json:"prompt_tokens"`
	Cached      float64 `json:"cached_prompt_tokens"`
	CachedShare num     `json:"cached_share"`
}

type healthData struct {
	Status    string `json:"status"`
	Usable    int    `json:"usable"`
	Upstreams int    `json:"upstreams"`
}

type upstreamData struct {
	ID          string             `json:"id"`
	Fleet       string             `json:"fleet"`
	Healthy     bool               `json:"healthy"`
	Available   bool               `json:"available"`
	Quarantined bool               `json:"quarantined"`
	Inflight    float64            `json:"inflight"`
	Pending     float64            `json:"pending_prefill_tokens"`
	Load        float64            `json:"load_tokens"`
	Requests    float64            `json:"requests"`
	CachedShare num                `json:"cached_share"`
	Reasons     map[string]float64 `json:"reasons"`
	InflightT   []num              `json:"inflight_series"`
	rateSeries
}

type modelData struct {
	Model       string  `json:"model"`
	Inflight    float64 `json:"inflight"`
	Requests    float64 `json:"requests"`
	CachedShare num     `json:"cached_share"`
	InflightT   []num   `json:"inflight_series"`
	rateSeries
}

func ratio(a, b float64) num {
	if b <= 0 {
		return num(math.NaN())
	}
	return num(a / b)
}

// active reports any rate above zero.
func active(rates []num) bool {
	for _, r := range rates {
		if r > 0 {
			return true
		}
	}
	return false
}

// appendRates appends the rates between counts a (earlier) and b.
func (rs *rateSeries) appendRates(a, b counts, dt float64) {
	d := func(x, y float64) float64 { return max(0, y-x) }
	rs.RPS = append(rs.RPS, num(d(a.Requests, b.Requests)/dt))
	rs.EPS = append(rs.EPS, num(d(a.Errors, b.Errors)/dt))
	rs.OutputTPS = append(rs.OutputTPS, num(d(a.Output, b.Output)/dt))
	rs.CachedShare = append(rs.CachedShare, ratio(d(a.Cached, b.Cached), d(a.Prompt, b.Prompt)))
}

// quantile estimates the q-quantile from the bucket-count differences of
// a cumulative histogram, interpolating linearly inside a bucket as
// Prometheus' histogram_quantile does. NaN when there are no observations.
func quantile(q float64, bounds, a, b []float64) float64 {
	if len(bounds) == 0 || len(b) != len(bounds) {
		return math.NaN()
	}
	delta := func(i int) float64 {
		if len(a) == len(b) {
			return max(0, b[i]-a[i])
		}
		return b[i]
	}
	total := delta(len(bounds) - 1) // the +Inf bucket
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	prevBound, prevCount := 0.0, 0.0
	for i, ub := range bounds {
		c := delta(i)
		if c >= rank {
			if math.IsInf(ub, 1) {
				return prevBound // as histogram_quantile: the highest finite bound
			}
			if c == prevCount {
				return ub
			}
			return prevBound + (ub-prevBound)*(rank-prevCount)/(c-prevCount)
		}
		prevBound, prevCount = ub, c
	}
	return bounds[len(bounds)-1]
}

// data computes the dashboard JSON from the samples and a fresh snapshot
// of the gauges.
func (h *history) data(now time.Time) dashboardData {
	out := dashboardData{Now: now.Unix(), Reasons: map[string][]num{}, ReasonTotals: map[string]float64{}}
	if h == nil {
		out.Health = healthData{Status: "unhealthy"}
		out.Recent = recentDecisions.list()
		return out
	}
	out.IntervalSeconds = h.interval.Seconds()
	ss := h.ordered()
	// The latest state comes from a fresh snapshot, so that the page is
	// current even between samples.
	cur := h.m.snapshot(now)
	if len(ss) > 0 && now.Sub(ss[len(ss)-1].T) >= h.interval/2 {
		ss = append(ss, cur)
	}

	ids := map[string]bool{}
	models := map[string]bool{}
	reasons := map[string]bool{}
	for _, s := range ss {
		for id := range s.Up {
			ids[id] = true
		}
		for m := range s.Model {
			models[m] = true
		}
		for r := range s.Reasons {
			reasons[r] = true
		}
	}
	for id := range cur.Up {
		ids[id] = true
	}
	for m := range cur.Model {
		models[m] = true
	}
	upd := make(map[string]*upstreamData, len(ids))
	for id := range ids {
		upd[id] = &upstreamData{ID: id, Reasons: map[string]float64{}}
	}
	md := make(map[string]*modelData, len(models))
	for m := range models {
		md[m] = &modelData{Model: m}
	}
	for i := 1; i < len(ss); i++ {
		a, b := ss[i-1], ss[i]
		dt := b.T.Sub(a.T).Seconds()
		if dt <= 0 {
			dt = h.interval.Seconds()
		}
		out.T = append(out.T, num(float64(b.T.UnixMilli())/1000))
		out.System.appendRates(a.All, b.All, dt)
		out.TTFTP50 = append(out.TTFTP50, num(quantile(0.5, b.TTFTBounds, a.TTFT, b.TTFT)))
		out.TTFTP95 = append(out.TTFTP95, num(quantile(0.95, b.TTFTBounds, a.TTFT, b.TTFT)))
		out.IndexBytes = append(out.IndexBytes, num(b.IndexBytes))
		out.IndexBudget = append(out.IndexBudget, num(b.IndexBudget))
		out.IndexEntries = append(out.IndexEntries, num(b.IndexItems))
		for r := range reasons {
			out.Reasons[r] = append(out.Reasons[r], num(max(0, b.Reasons[r]-a.Reasons[r])/dt))
		}
		for id, u := range upd {
			var ca, cb counts
			if x := a.Up[id]; x != nil {
				ca = x.counts
			}
			inflight := math.NaN()
			if x := b.Up[id]; x != nil {
				cb = x.counts
				inflight = x.Inflight
			}
			if a.Up[id] == nil {
				ca = cb // appeared in this interval: no rate yet
			}
			u.appendRates(ca, cb, dt)
			u.InflightT = append(u.InflightT, num(inflight))
		}
		for m, x := range md {
			var ca, cb counts
			inflight := 0.0
			if y := a.Model[m]; y != nil {
				ca = y.counts
			}
			if y := b.Model[m]; y != nil {
				cb = y.counts
				inflight = y.Inflight
			}
			x.appendRates(ca, cb, dt)
			x.InflightT = append(x.InflightT, num(inflight))
		}
	}

	// Totals and the current gauges; window figures from the first sample.
	var first sample
	if len(ss) > 0 {
		first = ss[0]
	}
	out.Totals = totalsData{Requests: cur.All.Requests, Errors: cur.All.Errors,
		Prompt: cur.All.Prompt, Cached: cur.All.Cached, CachedShare: ratio(cur.All.Cached, cur.All.Prompt)}
	for r, v := range cur.Reasons {
		out.ReasonTotals[r] = v
	}
	for id, u := range upd {
		if x := cur.Up[id]; x != nil {
			u.Fleet, u.Healthy, u.Available, u.Quarantined = x.Fleet, x.Healthy, x.Available, x.Quarantine
			u.Inflight, u.Pending, u.Load, u.Requests = x.Inflight, x.Pending, x.Load, x.Requests
			u.CachedShare = ratio(x.Cached, x.Prompt)
			for r, v := range x.Reasons {
				base := 0.0
				if f := first.Up[id]; f != nil && len(ss) > 1 {
					base = f.Reasons[r]
				}
				u.Reasons[r] = max(0, v-base)
			}
		}
		if x := cur.Up[id]; (x != nil && x.Fleet != "") || active(u.RPS) {
			// Live replicas, and departed ones with traffic in the window.
			out.Upstreams = append(out.Upstreams, *u)
		}
	}
	for m, x := range md {
		if y := cur.Model[m]; y != nil {
			x.Inflight, x.Requests = y.Inflight, y.Requests
			x.CachedShare = ratio(y.Cached, y.Prompt)
		}
		if x.Inflight > 0 || active(x.RPS) {
			out.Models = append(out.Models, *x)
		}
	}
	sort.Slice(out.Upstreams, func(i, j int) bool {
		if out.Upstreams[i].Fleet != out.Upstreams[j].Fleet {
			return out.Upstreams[i].Fleet < out.Upstreams[j].Fleet
		}
		return out.Upstreams[i].ID < out.Upstreams[j].ID
	})
	sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].Model < out.Models[j].Model })

	usable, known := 0, 0
	for _, u := range out.Upstreams {
		if x := cur.Up[u.ID]; x == nil || u.Fleet == "" {
			continue // no longer part of a live fleet
		}
		known++
		if u.Healthy { // as /health counts
			usable++
		}
	}
	out.Health = healthData{Usable: usable, Upstreams: known}
	switch {
	case usable == 0:
		out.Health.Status = "unhealthy"
	case usable < known:
		out.Health.Status = "degraded"
	default:
		out.Health.Status = "ok"
	}
	out.Recent = recentDecisions.list()
	return out
}

// decisionRecord is one routed request as the dashboard lists it: opaque
// ids and numbers only, never prompt text or addresses.
type decisionRecord struct {
	Time         int64   `json:"time_ms"`
	Fleet        string  `json:"fleet"`
	Upstream     string  `json:"upstream"`
	Model        string  `json:"model"`
	Reason       string  `json:"reason"`
	Tie          string  `json:"tie,omitempty"`
	Overlap      int     `json:"overlap_tokens"`
	BestOverlap  int     `json:"best_overlap_tokens"`
	Score        float64 `json:"score"`
	Load         float64 `json:"load_tokens"`
	Usable       int     `json:"usable"`
	Outcome      string  `json:"outcome"`
	Status       int     `json:"status"`
	TTFTMillis   float64 `json:"ttft_ms,omitempty"`
	TotalMillis  float64 `json:"duration_ms"`
	PromptTokens int64   `json:"prompt_tokens,omitempty"`
	CachedTokens int64   `json:"cached_prompt_tokens,omitempty"`
}

// decisionRing keeps the last recentLen decisions.
type decisionRing struct {
	mu   sync.Mutex
	buf  [recentLen]decisionRecord
	next int
	n    int
}

var recentDecisions decisionRing

func (r *decisionRing) add(d decisionRecord) {
	r.mu.Lock()
	r.buf[r.next] = d
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
	r.mu.Unlock()
}

// reset forgets every decision.
func (r *decisionRing) reset() {
	r.mu.Lock()
	r.next, r.n = 0, 0
	r.mu.Unlock()
}

// list returns the decisions newest first.
func (r *decisionRing) list() []decisionRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]decisionRecord, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Dashboard)(nil)
	_ caddy.Validator             = (*Dashboard)(nil)
	_ caddy.CleanerUpper          = (*Dashboard)(nil)
	_ caddyhttp.MiddlewareHandler = (*Dashboard)(nil)
	_ caddyfile.Unmarshaler       = (*Dashboard)(nil)
	_ caddy.Destructor            = (*history)(nil)
)
