package module

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/dashboard"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/usage"
)

func TestDashboardServes(t *testing.T) {
	es := startObsEngines(t, 1, 0, 0)
	c := startObsCaddy(t, obsDials(es), obsOpts{})
	ops := "http://" + c.ops
	tests := []struct {
		name, method, path string
		want               int
		ctype, contains    string
	}{
		{name: "page", method: "GET", path: "/", want: 200, ctype: "text/html", contains: `src="assets/dashboard.js"`},
		{name: "page under a prefix", method: "GET", path: "/ramjet/", want: 200, ctype: "text/html", contains: "<title>ramjet</title>"},
		{name: "script", method: "GET", path: "/assets/dashboard.js", want: 200, ctype: "text/javascript", contains: "data.json"},
		{name: "uplot", method: "GET", path: "/assets/uPlot.iife.min.js", want: 200, ctype: "text/javascript", contains: "uPlot"},
		{name: "uplot css", method: "GET", path: "/assets/uPlot.min.css", want: 200, ctype: "text/css", contains: ".uplot"},
		{name: "uplot license", method: "GET", path: "/assets/uPlot-LICENSE", want: 200, ctype: "text/plain", contains: "MIT"},
		{name: "data", method: "GET", path: "/data.json", want: 200, ctype: "application/json", contains: `"health"`},
		{name: "metrics beside it", method: "GET", path: "/metrics", want: 200, ctype: "text/plain", contains: "ramjet_"},
		{name: "unknown asset", method: "GET", path: "/assets/nope.js", want: 404},
		{name: "unknown page", method: "GET", path: "/secret", want: 404},
		{name: "post", method: "POST", path: "/", want: 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := c.do(tt.method, ops+tt.path, "")
			if resp.StatusCode != tt.want {
				t.Fatalf("%s %s: %s, want %d", tt.method, tt.path, resp.Status, tt.want)
			}
			if tt.ctype != "" && !strings.HasPrefix(resp.Header.Get("Content-Type"), tt.ctype) {
				t.Errorf("Content-Type %q, want %s", resp.Header.Get("Content-Type"), tt.ctype)
			}
			if !strings.Contains(string(b), tt.contains) {
				t.Errorf("body lacks %q", tt.contains)
			}
		})
	}
}

// TestDashboardData drives a private metric set and checks the rates and
// shares the dashboard computes between samples.
func TestDashboardData(t *testing.T) {
	fleet := []fleetstate.Snapshot{{Key: "default", IndexEntries: 5, IndexBytes: 1000, IndexBudget: 4000,
		Replicas: []fleetstate.ReplicaSnapshot{
			{ID: "aaaa", Inflight: 2, Known: true, Healthy: true, Available: true},
			{ID: "bbbb", Known: true, Healthy: false, Fails: 3, Quarantined: true},
		}}}
	m := metrics.NewSet(func() []fleetstate.Snapshot { return fleet }, modelNames)
	h := newHistory(m, time.Second, 4)
	t0 := time.Unix(1_700_000_000, 0)
	h.Sample(t0)

	decide := func(n int, reason selection.Reason) {
		for range n {
			m.ObserveSelection("aaaa", selection.Decision{Index: 0, Reason: reason}, false, time.Microsecond)
		}
	}
	decide(6, selection.ReasonAffinity)
	decide(2, selection.ReasonCold)
	for i := range 8 {
		l := m.StartRequest("aaaa", "m")
		status := 200
		if i == 7 {
			status = 500
		}
		m.EndRequest(l, &metrics.Exchange{Upstream: "aaaa", Model: "m", Status: status, Stream: true,
			Start: t0, FirstByte: t0.Add(time.Duration(i+1) * 10 * time.Millisecond), End: t0.Add(time.Second),
			Usage: usage.Usage{PromptTokens: 100, CachedTokens: 75, CompletionTokens: 10}, HasUsage: status == 200})
	}
	h.Sample(t0.Add(2 * time.Second))
	d := h.data(t0.Add(2 * time.Second)) // a fresh snapshot is not added this close to the last sample

	if len(d.T) != 1 {
		t.Fatalf("%d points, want 1 (two samples)", len(d.T))
	}
	approx := func(what string, got dashboard.Num, want float64) {
		t.Helper()
		if math.Abs(float64(got)-want) > 1e-6 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	approx("requests/s", d.System.RPS[0], 4)
	approx("errors/s", d.System.EPS[0], 0.5)
	approx("output tokens/s", d.System.OutputTPS[0], 35)
	approx("cached share", d.System.CachedShare[0], 0.75)
	approx("affinity/s", d.Reasons["affinity"][0], 3)
	approx("cold/s", d.Reasons["cold"][0], 1)
	if p50, p95 := float64(d.TTFTP50[0]), float64(d.TTFTP95[0]); !(p50 > 0.025 && p50 <= 0.05 && p95 > 0.05 && p95 <= 0.1) {
		t.Errorf("TTFT p50 %v p95 %v for 10..70ms (7 streams)", p50, p95)
	}
	approx("index bytes", d.IndexBytes[0], 1000)
	approx("index budget", d.IndexBudget[0], 4000)
	if d.Health.Status != "degraded" || d.Health.Usable != 1 || d.Health.Upstreams != 2 {
		t.Errorf("health %+v, want degraded 1/2", d.Health)
	}
	if len(d.Upstreams) != 2 || d.Upstreams[0].ID != "aaaa" || d.Upstreams[0].Inflight != 2 ||
		d.Upstreams[0].Reasons["affinity"] != 6 || !d.Upstreams[1].Quarantined {
		t.Errorf("upstreams %+v", d.Upstreams)
	}
	if len(d.Models) != 1 || d.Models[0].Model != "m" || d.Models[0].Requests != 8 {
		t.Errorf("models %+v", d.Models)
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
		h.Sample(t0.Add(time.Duration(3+i) * time.Second))
	}
	if n := len(h.Samples()); n != 4 {
		t.Errorf("history keeps %d samples, want 4", n)
	}
}

func labelMap(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// findChromium returns a headless-capable Chromium, installing Debian's
// package when it is missing and installation is possible.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if _, err := exec.LookPath("apt-get"); err == nil && os.Geteuid() == 0 {
		t.Log("chromium not found: installing Debian's chromium package")
		for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "chromium"}} {
			cmd := exec.Command("apt-get", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Logf("apt-get %s: %v\n%s", strings.Join(args, " "), err, out)
				break
			}
		}
		if p, err := exec.LookPath("chromium"); err == nil {
			return p
		}
	}
	t.Skip("chromium not found and it cannot be installed here (need root and apt-get): skipping the browser test of the dashboard")
	return ""
}

// runChromium runs headless Chromium on url with extra flags and returns
// its standard output.
func runChromium(t *testing.T, bin, url string, extra ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
		"--user-data-dir=" + t.TempDir()}, extra...)
	args = append(args, url)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", extra, err, stderr.String())
	}
	return out
}

// trafficUntil sends streamed chat traffic (shared system prompts,
// multi-turn conversations) through the client port with the OpenAI SDK
// until ctx ends or each worker has sent max requests.
func trafficUntil(ctx context.Context, t *testing.T, c *obsCaddy, model string, workers, max int) *sync.WaitGroup {
	cl := openai.NewClient(option.WithBaseURL("http://"+c.client+"/v1/"), option.WithAPIKey("test"),
		option.WithMaxRetries(0), option.WithRequestTimeout(20*time.Second))
	systems := []string{obsText("support agent", 6000), obsText("code assistant", 9000), obsText("translator", 4000), obsText("analyst", 7000)}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var msgs []openai.ChatCompletionMessageParamUnion
			for i := 0; i < max && ctx.Err() == nil; i++ {
				if i%4 == 0 {
					msgs = []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(systems[(w+i/4)%len(systems)])}
				}
				msgs = append(msgs, openai.UserMessage(fmt.Sprintf("worker %d question %d: %s", w, i, obsText("q", 300))))
				stream := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
					Model: model, Messages: msgs, MaxTokens: openai.Int(24),
					StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
				})
				var reply strings.Builder
				for stream.Next() {
					if ch := stream.Current(); len(ch.Choices) > 0 {
						reply.WriteString(ch.Choices[0].Delta.Content)
					}
				}
				if err := stream.Err(); err != nil && ctx.Err() == nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				stream.Close()
				msgs = append(msgs, openai.AssistantMessage(reply.String()))
			}
		}()
	}
	return &wg
}

// TestDashboardChromium loads the dashboard in real headless Chromium
// against a running ramjet with simulated engines under live traffic, checks
// that the charts drew live data, and saves the screenshot to
// docs/dashboard.png.
func TestDashboardChromium(t *testing.T) {
	bin := findChromium(t)
	ctx := context.Background()
	var dials []string
	for range 3 {
		s, err := enginesim.Start(ctx, enginesim.Options{TimeScale: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		dials = append(dials, s.Addr())
	}
	c := startObsCaddy(t, dials, obsOpts{SampleInterval: "250ms"}) // Caddy's passive health only: an active check with a 1s timeout fails on a loaded machine

	tctx, stop := context.WithTimeout(ctx, 60*time.Second)
	defer stop()
	resetMetrics()
	wg := trafficUntil(tctx, t, c, "qwen3-32b", 6, 400)
	defer wg.Wait()
	defer stop()

	// Let a few seconds of history build up.
	obsEventually(t, "traffic with usage and a few samples", func() bool {
		h := currentHistory()
		return h != nil && len(h.Samples()) >= 12 && fleetGauge(t, processMetrics().Own, "ramjet_cached_prompt_tokens_total") > 0
	})

	page := "http://" + c.ops + "/"
	dom := string(runChromium(t, bin, page, "--window-size=1400,1000", "--virtual-time-budget=4000", "--dump-dom"))
	attr := func(id, name string) float64 {
		re := regexp.MustCompile(`id="` + id + `"[^>]*?data-` + name + `="([0-9.e+-]+)"|data-` + name + `="([0-9.e+-]+)"[^>]*?id="` + id + `"`)
		m := re.FindStringSubmatch(dom)
		if m == nil {
			t.Errorf("chart %s has no data-%s in the DOM", id, name)
			return 0
		}
		v, _ := strconv.ParseFloat(m[1]+m[2], 64)
		return v
	}
	if n := strings.Count(dom, "<canvas"); n < 8 {
		t.Errorf("%d canvases in the page, want the line charts of both tabs (>= 8)", n)
	}
	for _, id := range []string{"c-rps", "c-cached", "c-ttft", "c-load", "c-index", "c-up-tps", "c-reasons", "c-model-tps"} {
		if p := attr(id, "points"); p < 2 {
			t.Errorf("chart %s drew %v data points", id, p)
		}
		if v := attr(id, "max"); v <= 0 {
			t.Errorf("chart %s has no value above 0 (max %v)", id, v)
		}
	}
	for _, id := range []string{"b-health", "b-up-cached", "b-up-reasons", "b-model-cached"} {
		if n := attr(id, "items"); n < 1 {
			t.Errorf("bar chart %s has %v bars", id, n)
		}
		if v := attr(id, "total"); v <= 0 {
			t.Errorf("bar chart %s totals %v", id, v)
		}
	}
	if n := attr("b-health", "items"); n != 3 {
		t.Errorf("health bars for %v replicas, want 3", n)
	}
	if u := regexp.MustCompile(`data-updates="(\d+)"`).FindStringSubmatch(dom); u == nil || u[1] == "0" {
		t.Errorf("the page never rendered data (updates %v)", u)
	}
	if !strings.Contains(dom, `class="badge ok"`) {
		t.Errorf("health badge is not ok")
	}
	if strings.Count(dom, `<td class="id">`) < 5 {
		t.Errorf("recent decisions table has fewer than 5 rows")
	}
	for _, d := range dials {
		if strings.Contains(dom, d) {
			t.Errorf("the page shows the engine address %s", d)
		}
	}
	dashboardScreenshots(t, bin, page)

	// Once the traffic stops nothing stays in flight, and only the
	// requests cut by the stop count as canceled.
	stop()
	wg.Wait()
	m := processMetrics()
	obsEventually(t, "nothing in flight", func() bool {
		return fleetGauge(t, m.Own, "ramjet_model_inflight_requests") == 0 &&
			fleetGauge(t, m.Own, "ramjet_upstream_inflight_requests") == 0 &&
			fleetGauge(t, m.Own, "ramjet_upstream_pending_prefill_tokens") == 0
	})
	canceled := 0.0
	for _, mf := range mustGather(t, m.Own) {
		if mf.GetName() == "ramjet_requests_total" {
			for _, x := range mf.GetMetric() {
				if l := labelMap(x); l["outcome"] != metrics.OutcomeOK && l["outcome"] != metrics.OutcomeCanceled {
					t.Errorf("%v requests ended %s", x.GetCounter().GetValue(), l["outcome"])
				} else if l["outcome"] == metrics.OutcomeCanceled {
					canceled += x.GetCounter().GetValue()
				}
			}
		}
	}
	if canceled > 6 {
		t.Errorf("%v requests counted canceled; only the 6 cut by the stop were", canceled)
	}
}

// dashboardScreenshots takes the overview and the serving tab as seen by
// Chromium and checks they rendered. With RAMJET_UPDATE_SCREENSHOTS=1 it
// saves them to docs/ (dashboard.png is the one in the README); otherwise
// to the test's temporary directory, so that go test leaves the tree clean.
func dashboardScreenshots(t *testing.T, bin, page string) {
	docs := t.TempDir()
	if os.Getenv("RAMJET_UPDATE_SCREENSHOTS") == "1" {
		root, err := filepath.Abs("..")
		if err != nil {
			t.Fatal(err)
		}
		docs = filepath.Join(root, "docs")
		if err := os.MkdirAll(docs, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct{ file, frag, size string }{
		{"dashboard.png", "", "1400,1180"},
		{"dashboard-serving.png", "#serving", "1400,1320"},
	} {
		dir := t.TempDir()
		shot := filepath.Join(dir, "shot.png")
		runChromium(t, bin, page+s.frag, "--window-size="+s.size, "--virtual-time-budget=4000", "--screenshot="+shot)
		b, err := os.ReadFile(shot)
		if err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
		if len(b) < 20_000 || string(b[1:4]) != "PNG" {
			t.Fatalf("screenshot %s is not a rendered PNG (%d bytes)", s.file, len(b))
		}
		if err := os.WriteFile(filepath.Join(docs, s.file), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDashboardCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    Dashboard
		wantErr string
	}{
		{name: "bare", give: "ramjet_dashboard"},
		{name: "interval", give: "ramjet_dashboard {\n sample_interval 500ms\n}", want: Dashboard{SampleInterval: caddy.Duration(500 * time.Millisecond)}},
		{name: "argument", give: "ramjet_dashboard /x", wantErr: "wrong argument count"},
		{name: "unknown option", give: "ramjet_dashboard {\n colour blue\n}", wantErr: "ramjet_dashboard: unrecognized option 'colour'"},
		{name: "duplicate", give: "ramjet_dashboard {\n sample_interval 1s\n sample_interval 2s\n}", wantErr: "specified more than once"},
		{name: "missing value", give: "ramjet_dashboard {\n sample_interval\n}", wantErr: "missing value"},
		{name: "bad duration", give: "ramjet_dashboard {\n sample_interval soon\n}", wantErr: "sample_interval"},
		{name: "two values", give: "ramjet_dashboard {\n sample_interval 1s 2s\n}", wantErr: "too many values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d Dashboard
			err := d.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.SampleInterval != tt.want.SampleInterval {
				t.Errorf("sample_interval %v, want %v", d.SampleInterval, tt.want.SampleInterval)
			}
		})
	}
	for _, give := range []caddy.Duration{caddy.Duration(time.Millisecond), caddy.Duration(2 * time.Hour)} {
		if err := (&Dashboard{SampleInterval: give}).Validate(); err == nil || !strings.Contains(err.Error(), "sample_interval") {
			t.Errorf("Validate(%v) = %v, want a sample_interval error", time.Duration(give), err)
		}
	}
}

// TestDeployOpsPort runs the production deploy/Caddyfile: the ops port
// serves the metrics and the dashboard, and the metrics count what the
// guard rejects as well as what the engines answer.
func TestDeployOpsPort(t *testing.T) {
	es := startObsEngines(t, 2, 0, 0)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{"RJ_UPSTREAM": strings.Join(obsDials(es), ",")})
	c := &obsCaddy{t: t}
	resetMetrics()
	m := processMetrics()

	resp, b := c.do("POST", p.base+"/v1/chat/completions", `{"model":"m","messages":[`)
	if resp.StatusCode != 400 {
		t.Fatalf("malformed body: %s: %s", resp.Status, b)
	}
	resp, b = c.do("POST", p.base+"/v1/chat/completions", obsChat("m", false, obsText("deploy", 1500), "q"))
	if resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	id := resp.Header.Get(HeaderUpstream)
	obsEventually(t, "both requests accounted", func() bool { return fleetGauge(t, m.Own, "ramjet_requests_total") == 2 })
	if got := requestsTotal(m, "", "", metrics.OutcomeClientError); got != 1 {
		t.Errorf("guard rejections counted = %v, want 1", got)
	}
	if got := requestsTotal(m, id, "m", metrics.OutcomeOK); got != 1 {
		t.Errorf("ok requests on %s = %v, want 1", id, got)
	}
	if got := seriesValue(m, "prompt_tokens_total", "upstream", id, "model", "m"); got <= 0 {
		t.Errorf("prompt tokens on %s = %v", id, got)
	}

	resp, b = c.do("GET", p.metrics+"/metrics", "")
	if resp.StatusCode != 200 || !strings.Contains(string(b), `ramjet_requests_total{model="m",outcome="ok",upstream="`+id+`"} 1`) {
		t.Errorf("ops /metrics: %s:\n%.600s", resp.Status, b)
	}
	resp, b = c.do("GET", p.metrics+"/", "")
	if resp.StatusCode != 200 || !strings.Contains(string(b), "<title>ramjet</title>") {
		t.Errorf("ops /: %s: %.200s", resp.Status, b)
	}
	resp, b = c.do("GET", p.metrics+"/data.json", "")
	var d dashboard.Data
	if err := json.Unmarshal(b, &d); err != nil || resp.StatusCode != 200 {
		t.Fatalf("ops /data.json: %s: %v", resp.Status, err)
	}
	if d.Totals.Requests != 2 || d.Totals.Errors != 1 || len(d.Recent) != 1 || d.Recent[0].Upstream != id {
		t.Errorf("dashboard data: totals %+v, recent %+v", d.Totals, d.Recent)
	}
}
