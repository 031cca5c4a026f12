package dashboard

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	h := func(c ...float64) Histogram { return Histogram{Bounds: []float64{0.1, 0.5, 1, math.Inf(1)}, Counts: c} }
	tests := []struct {
		name string
		a, b Histogram
		q    float64
		want float64
	}{
		{name: "median in first bucket", b: h(10, 10, 10, 10), q: 0.5, want: 0.05},
		{name: "p95 in second", b: h(5, 10, 10, 10), q: 0.95, want: 0.1 + 0.4*(9.5-5)/5},
		{name: "deltas", a: h(5, 5, 5, 5), b: h(5, 15, 15, 15), q: 0.5, want: 0.1 + 0.4*0.5},
		{name: "in +Inf", b: h(0, 0, 0, 4), q: 0.5, want: 1},
		{name: "no observations", b: h(3, 3, 3, 3), a: h(3, 3, 3, 3), q: 0.5, want: math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Quantile(tt.q, tt.a, tt.b)
			if math.IsNaN(tt.want) != math.IsNaN(got) || (!math.IsNaN(got) && math.Abs(got-tt.want) > 1e-9) {
				t.Errorf("Quantile = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSampleTTFT: the sample's TTFT histogram is the counts per bucket
// made cumulative, its bounds inclusive.
func TestSampleTTFT(t *testing.T) {
	c := newCounts()
	for _, ms := range []int{4, 5, 300, 40000} {
		c.end(exchange{Upstream: "aa", Model: "m", TTFT: time.Duration(ms) * time.Millisecond})
	}
	c.end(exchange{Model: "m", TTFT: time.Millisecond}) // no upstream
	c.end(exchange{Upstream: "aa", Model: "m"})         // not streamed
	h := SampleOf(time.Now(), c.gauges(Gauges{})).TTFT
	want := make([]float64, len(TTFTBounds)+1)
	for i, b := range h.Bounds {
		switch {
		case b >= 30*1.5:
			want[i] = 4
		case b >= 0.3:
			want[i] = 3
		default:
			want[i] = 2
		}
	}
	if !equal(h.Counts, want) {
		t.Errorf("counts %v, want %v (cumulative, bound inclusive)", h.Counts, want)
	}
}

// exchange is a finished request as package metrics counts it.
type exchange struct {
	Upstream, Model        string
	Error, HasUsage        bool
	Prompt, Cached, Output float64
	TTFT                   time.Duration // 0: not streamed
}

// counts are what package metrics' records count and report in Gauges:
// the finished requests and those in flight by (upstream, model), the
// decisions by (upstream, reason), the routed streams' TTFT per bucket.
type counts struct {
	ended   map[[2]string]*Ended
	decided map[[2]string]float64
	ttft    []float64
}

func newCounts() *counts {
	return &counts{ended: map[[2]string]*Ended{}, decided: map[[2]string]float64{}, ttft: make([]float64, len(TTFTBounds)+1)}
}

func (c *counts) pair(upstream, model string) *Ended {
	k := [2]string{upstream, model}
	n := c.ended[k]
	if n == nil {
		n = &Ended{Upstream: upstream, Model: model}
		c.ended[k] = n
	}
	return n
}

// start counts a request of model in flight on upstream ("": none).
func (c *counts) start(upstream, model string) { c.pair(upstream, model).Inflight++ }

// end counts a finished request as the metrics do.
func (c *counts) end(x exchange) {
	n := c.pair(x.Upstream, x.Model)
	n.Requests++
	if x.Error {
		n.Errors++
	}
	if x.Upstream != "" && x.HasUsage {
		n.Prompt, n.Cached, n.Output = n.Prompt+x.Prompt, n.Cached+x.Cached, n.Output+x.Output
	}
	if x.Upstream != "" && x.TTFT > 0 {
		c.ttft[sort.SearchFloat64s(TTFTBounds, x.TTFT.Seconds())]++
	}
}

func (c *counts) decide(upstream, reason string) { c.decided[[2]string{upstream, reason}]++ }

// gauges is g with c's counts.
func (c *counts) gauges(g Gauges) Gauges {
	for _, n := range c.ended {
		g.Ended = append(g.Ended, *n)
	}
	for k, n := range c.decided {
		g.Decided = append(g.Decided, Decided{Upstream: k[0], Reason: k[1], N: n})
	}
	g.TTFT = c.ttft
	return g
}

func equal(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStoreData feeds a Recorder typed events and checks the rates, shares,
// quantiles and gauges the Store computes between two samples.
func TestStoreData(t *testing.T) {
	c := newCounts()
	g := Gauges{Index: Index{Bytes: 1000, Budget: 4000, Entries: 5}, Replicas: []Replica{
		{ID: "aaaa", Fleet: "default", Inflight: 2, Healthy: true, Available: true},
		{ID: "bbbb", Fleet: "default", Quarantined: true},
	}}
	s := NewStore(time.Second, 4, func(now time.Time) Sample { return SampleOf(now, c.gauges(g)) })
	t0 := time.Unix(1_700_000_000, 0)
	s.Sample(t0)
	for range 6 {
		c.decide("aaaa", "affinity")
	}
	c.decide("", "none")
	c.decide("aaaa", "cold")
	for i := range 8 {
		x := exchange{Upstream: "aaaa", Model: "m", Error: i == 7, HasUsage: i != 7,
			Prompt: 100, Cached: 75, Output: 10, TTFT: time.Duration(i+1) * 10 * time.Millisecond}
		c.end(x)
	}
	c.end(exchange{Error: true}) // rejected before routing
	s.Sample(t0.Add(2 * time.Second))
	d := s.Data(t0.Add(2*time.Second), []Record{{Upstream: "aaaa"}})

	if len(d.T) != 1 {
		t.Fatalf("%d points, want 1 (two samples)", len(d.T))
	}
	approx := func(what string, got Num, want float64) {
		t.Helper()
		if math.Abs(float64(got)-want) > 1e-6 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	approx("requests/s", d.System.RPS[0], 4.5)
	approx("errors/s", d.System.EPS[0], 1)
	approx("output tokens/s", d.System.OutputTPS[0], 35)
	approx("cached share", d.System.CachedShare[0], 0.75)
	approx("affinity/s", d.Reasons["affinity"][0], 3)
	approx("none/s", d.Reasons["none"][0], 0.5)
	if p50, p95 := float64(d.TTFTP50[0]), float64(d.TTFTP95[0]); !(p50 > 0.025 && p50 <= 0.05 && p95 > 0.05 && p95 <= 0.1) {
		t.Errorf("TTFT p50 %v p95 %v for 10..80ms", p50, p95)
	}
	approx("index bytes", d.IndexBytes[0], 1000)
	if d.Health != (Health{Status: "degraded", Usable: 1, Upstreams: 2}) {
		t.Errorf("health %+v, want degraded 1/2", d.Health)
	}
	if len(d.Upstreams) != 2 || d.Upstreams[0].ID != "aaaa" || d.Upstreams[0].Inflight != 2 ||
		d.Upstreams[0].Reasons["affinity"] != 6 || !d.Upstreams[1].Quarantined {
		t.Errorf("upstreams %+v", d.Upstreams)
	}
	if len(d.Models) != 2 || d.Models[0].Model != "m" || d.Models[0].Requests != 8 || d.Models[1].Model != "unknown" {
		t.Errorf("models %+v", d.Models)
	}
	if d.Totals.Requests != 9 || d.Totals.Errors != 2 || d.Totals.Prompt != 700 || len(d.Recent) != 1 {
		t.Errorf("totals %+v, recent %v", d.Totals, d.Recent)
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "NaN") {
		t.Errorf("JSON carries NaN: %s", b)
	}

	// The ring keeps the last n samples.
	for i := range 10 {
		s.Sample(t0.Add(time.Duration(3+i) * time.Second))
	}
	if n := len(s.Samples()); n != 4 {
		t.Errorf("store keeps %d samples, want 4", n)
	}
	if x := SampleOf(t0, Gauges{}); x.All != (Counts{}) || len(x.Up) != 0 || len(x.Model) != 0 {
		t.Errorf("without counts: %+v", x)
	}
}

func TestStoreSamplerStops(t *testing.T) {
	s := NewStore(10*time.Millisecond, 8, func(now time.Time) Sample { return SampleOf(now, Gauges{}) })
	s.Start()
	for deadline := time.Now().Add(10 * time.Second); len(s.Samples()) < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no samples taken")
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	default:
		t.Fatal("sampler still running after Close")
	}
	if err := s.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
}

// TestAssetsSelfContained: the page loads nothing from outside the binary.
func TestAssetsSelfContained(t *testing.T) {
	url := regexp.MustCompile(`(?:src|href)\s*=\s*["']([^"']+)`)
	for _, name := range []string{"assets/index.html", "assets/dashboard.js", "assets/dashboard.css"} {
		b, err := assetsFS.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range url.FindAllSubmatch(b, -1) {
			if strings.Contains(string(m[1]), "//") {
				t.Errorf("%s loads %s from outside", name, m[1])
			}
		}
		if strings.Contains(string(b), "@import") || strings.Contains(string(b), "url(http") {
			t.Errorf("%s imports remote styles", name)
		}
	}
	for name, a := range assets {
		if _, err := assetsFS.ReadFile(a.file); err != nil {
			t.Errorf("asset %s: %v", name, err)
		}
	}
}

func TestHandler(t *testing.T) {
	h := Handler{Data: func(now time.Time) Data { return Data{Now: now.Unix(), Health: Health{Status: "ok"}} }}
	tests := []struct {
		method, path string
		want         int
		ctype, body  string
	}{
		{"GET", "/", 200, "text/html", "<title>ramjet</title>"},
		{"GET", "/x/", 200, "text/html", `src="assets/dashboard.js"`},
		{"HEAD", "/assets/dashboard.css", 200, "text/css", ""},
		{"GET", "/x/data.json", 200, "application/json", `"status":"ok"`},
		{"GET", "/assets/nope.js", 404, "", ""},
		{"GET", "/secret", 404, "", ""},
		{"POST", "/", 405, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(tt.method, tt.path, nil))
			if w.Code != tt.want {
				t.Fatalf("status %d, want %d", w.Code, tt.want)
			}
			if !strings.HasPrefix(w.Header().Get("Content-Type"), tt.ctype) || !strings.Contains(w.Body.String(), tt.body) {
				t.Errorf("Content-Type %q, body %.80q", w.Header().Get("Content-Type"), w.Body.String())
			}
			if tt.want == http.StatusMethodNotAllowed && w.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow %q", w.Header().Get("Allow"))
			}
		})
	}
}

// TestSampleInflight: the requests in flight by model show in the sample
// beside the model's counts, added over the pairs; a model with none in
// flight and no finished request is left out; "" is "unknown".
func TestSampleInflight(t *testing.T) {
	c := newCounts()
	c.start("aa", "m")
	c.start("bb", "m")
	c.start("bb", "")
	c.pair("aa", "m").Inflight--
	c.end(exchange{Model: "m"})
	s := SampleOf(time.Now(), c.gauges(Gauges{}))
	if m := s.Model["m"]; m == nil || m.Inflight != 1 || m.Requests != 1 {
		t.Errorf("model m: %+v, want 1 in flight, 1 request", m)
	}
	if u := s.Model["unknown"]; u == nil || u.Inflight != 1 || u.Requests != 0 {
		t.Errorf("model unknown: %+v, want 1 in flight", u)
	}
	c.pair("bb", "").Inflight--
	c.end(exchange{Model: "n"})
	s = SampleOf(time.Now(), c.gauges(Gauges{}))
	if _, ok := s.Model["unknown"]; ok {
		t.Errorf("a model with nothing in flight and no request is in the sample: %+v", s.Model["unknown"])
	}
	if n := s.Model["n"]; n == nil || n.Requests != 1 || n.Inflight != 0 {
		t.Errorf("model n: %+v", n)
	}
}
