package module

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/upstream"
)

func TestEngineMetricsCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    *enginemetrics.Settings
		wantErr string
	}{
		{name: "bare", give: "engine_metrics", want: &enginemetrics.Settings{}},
		{name: "interval", give: "engine_metrics 250ms", want: &enginemetrics.Settings{Interval: 250e6}},
		{name: "block", give: "engine_metrics 2s {\npath /m\ntimeout 1s\nscheme https\nupstream_token t\nstale_after 5\nmax_body_bytes 1MiB\nconcurrency 3\n}",
			want: &enginemetrics.Settings{Interval: 2e9, Path: "/m", Timeout: 1e9, Access: upstream.Access{Scheme: "https", UpstreamToken: "t"},
				StaleAfter: 5, MaxBodyBytes: 1 << 20, Concurrency: 3}},
		{name: "two intervals", give: "engine_metrics 1s 2s", wantErr: "engine_metrics: too many values"},
		{name: "bad interval", give: "engine_metrics soon", wantErr: `engine_metrics: "soon" is not a positive duration`},
		{name: "bad scheme", give: "engine_metrics {\nscheme ftp\n}", wantErr: "must be http or https"},
		{name: "unknown", give: "engine_metrics {\nfoo 1\n}", wantErr: "unrecognized option 'foo'"},
		{name: "duplicate", give: "engine_metrics {\npath /a\npath /b\n}", wantErr: "path specified more than once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := caddyfile.NewTestDispenser("ramjet {\n" + tt.give + "\n}")
			var s RamjetSelection
			err := s.UnmarshalCaddyfile(d)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, s.EngineMetrics); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
	for _, c := range []enginemetrics.Settings{{Path: "metrics"}, {Access: upstream.Access{Scheme: "gopher"}}, {StaleAfter: -1}, {Interval: -1}} {
		c.SetDefaults()
		if err := c.Validate(); err == nil {
			t.Errorf("validate(%+v) accepted", c)
		}
	}
}

// TestEngineMetricsFleet runs the real Caddy in front of simulated
// engines (one single-rank, one with two data-parallel ranks listed
// twice) with engine_metrics on: /ramjet/fleet shows each replica's
// engine-reported state by opaque id, this instance's own requests are
// not counted as external load, traffic that bypasses this instance is,
// and the scrapes are counted in the ops server's metrics.
func TestEngineMetricsFleet(t *testing.T) {
	cfg := engine.Config{CapacityTokens: 32768, BlockSize: 16}
	single := startSims(t, 1, enginesim.Options{TimeScale: 1, Engine: cfg})[0]
	dp := startSims(t, 1, enginesim.Options{TimeScale: 1, DP: 2, Engine: cfg})[0]
	c := startObsCaddy(t, []string{single.Addr(), dp.Addr(), dp.Addr()},
		obsOpts{Policy: map[string]any{"engine_metrics": map[string]any{"interval": "50ms", "timeout": "5s"}}})

	// The pool is known to the policy once it routed a request.
	if resp, b := c.chat(chatBody("qwen3-8b", false, [2]string{"user", "hello"})); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	f := lookupFleet("")
	idSingle := f.RouteID(single.Addr())
	var st fleetstate.State
	eventually(t, "three replicas scraped", func() bool {
		st = c.fleetState()
		ok := 0
		for _, e := range st.Engines {
			if e.State == "ok" {
				ok++
			}
		}
		return ok == 3
	})
	for _, e := range st.Engines {
		if e.Engine != "vllm" || e.Metrics.KVCapacityTokens != 32768 || !e.External.Fresh || e.External.KVCapacityTokens != 32768 {
			t.Fatalf("engine state %+v", e)
		}
	}

	// A long request through ramjet: the engine runs it, and it is ours.
	longReq := func(ctx context.Context, url string, done chan<- struct{}) {
		defer close(done)
		body := `{"model":"qwen3-8b","messages":[{"role":"user","content":"` + longText("x", 2000) + `"}],"max_tokens":30000,"stream":true}`
		req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if res, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ours := make(chan struct{})
	go longReq(ctx, c.url("/v1/chat/completions"), ours)
	var busy fleetstate.EngineState
	eventually(t, "our request running on its engine", func() bool {
		for _, e := range c.fleetState().Engines {
			if e.Metrics.Running == 1 && e.Local.Inflight == 1 {
				busy = e
				return true
			}
		}
		return false
	})
	if busy.External.Requests() != 0 || busy.Metrics.KVUsedTokens == 0 {
		t.Fatalf("our own request taken for external load: %+v", busy)
	}

	// Traffic that bypasses this instance (another ramjet, a client going
	// direct) shows as external load on that replica.
	theirs := make(chan struct{})
	go longReq(ctx, "http://"+single.Addr()+"/v1/chat/completions", theirs)
	eventually(t, "external load on the single-rank engine", func() bool {
		for _, e := range c.fleetState().Engines {
			if e.Upstream == idSingle {
				return e.External.Requests() >= 1 && e.External.Fresh
			}
		}
		return false
	})
	cancel()
	<-ours
	<-theirs

	resp, b := c.do("GET", "http://"+c.ops+"/metrics", "")
	if resp.StatusCode != 200 {
		t.Fatalf("metrics: %s", resp.Status)
	}
	for _, want := range []string{`ramjet_engine_scrapes_total{fleet="default",result="ok"}`,
		`ramjet_engine_kv_capacity_tokens{fleet="default",upstream="` + idSingle + `"} 32768`,
		`ramjet_engine_stale{fleet="default",upstream="` + idSingle + `"} 0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "ramjet_engine_") && strings.Contains(line, "127.0.0.1") {
			t.Fatalf("engine metrics leak an address: %s", line)
		}
	}
	raw, _ := json.Marshal(st)
	if strings.Contains(string(raw), "127.0.0.1") {
		t.Fatalf("fleet state leaks an address: %s", raw)
	}
}

func TestEngineSeriesDocumented(t *testing.T) {
	doc, err := os.ReadFile("OBSERVABILITY.md")
	if err != nil {
		t.Fatal(err)
	}
	names := describedNames(engineCollector)
	if len(names) < 9 {
		t.Fatalf("only %d engine series", len(names))
	}
	for n := range names {
		if !strings.Contains(string(doc), "`"+n) {
			t.Errorf("series %s is not documented in OBSERVABILITY.md", n)
		}
	}
}

// A reload with the same engine_metrics keeps the scraper (and what it
// knows); a reload without it stops the scraper and /ramjet/fleet shows
// no engines.
func TestEngineMetricsReload(t *testing.T) {
	ss := startSims(t, 2, enginesim.Options{})
	with := obsOpts{Policy: map[string]any{"engine_metrics": map[string]any{"interval": "50ms"}}}
	c := startObsCaddy(t, ss.dials(), with)
	if resp, b := c.chat(chatBody("qwen3-8b", false, [2]string{"user", "hi"})); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	live := func() *engineState {
		e, _ := engineLive.Get(DefaultStateKey)
		return e
	}
	eventually(t, "two replicas scraped", func() bool {
		n := 0
		for _, e := range c.fleetState().Engines {
			if e.State == "ok" {
				n++
			}
		}
		return n == 2
	})
	before := live()
	c.reload(with)
	if resp, b := c.chat(chatBody("qwen3-8b", false, [2]string{"user", "hi again"})); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	if after := live(); after != before {
		t.Fatal("a reload with the same engine_metrics started a new scraper")
	}
	if got := len(c.fleetState().Engines); got != 2 {
		t.Fatalf("%d engines after the reload", got)
	}
	c.reload(obsOpts{})
	eventually(t, "the scraper stopped", func() bool { return live() == nil })
	if got := c.fleetState().Engines; len(got) != 0 {
		t.Fatalf("engines without engine_metrics: %+v", got)
	}
}

// An engine whose /metrics stalls and one whose /metrics is garbage: the
// requests are served as before, and the scrapes are counted by result,
// the replicas stale (routed by local reservations only).
func TestEngineMetricsStallAndGarbage(t *testing.T) {
	ss := startSims(t, 2, enginesim.Options{})
	stop := make(chan struct{})
	stalled := metricsFront(t, ss[0], func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	})
	garbage := metricsFront(t, ss[1], func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("<html>upstream connect error</html>\n"))
	})
	defer close(stop)
	c := startObsCaddy(t, []string{stalled, garbage},
		obsOpts{Policy: map[string]any{"engine_metrics": map[string]any{"interval": "50ms", "timeout": "100ms", "stale_after": 1}}})
	for i := range 8 {
		if resp, b := c.chat(chatBody("qwen3-8b", false, [2]string{"user", fmt.Sprintf("request %d", i)})); resp.StatusCode != 200 {
			t.Fatalf("chat %d: %s: %s", i, resp.Status, b)
		}
	}
	eventually(t, "both replicas stale with their results", func() bool {
		got := map[string]bool{}
		for _, e := range c.fleetState().Engines {
			if e.State == "stale" && !e.External.Fresh && e.ConsecutiveFailures > 0 {
				got[e.Result] = true
			}
		}
		return got["timeout"] && got["parse"]
	})
	_, b := c.do("GET", "http://"+c.ops+"/metrics", "")
	for _, want := range []string{`ramjet_engine_fallback_replicas{fleet="default"} 2`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, res := range []string{"timeout", "parse"} {
		re := regexp.MustCompile(`ramjet_engine_scrapes_total\{fleet="default",result="` + res + `"\} ([0-9]+)`)
		if m := re.FindStringSubmatch(string(b)); m == nil || m[1] == "0" {
			t.Errorf("no %s scrapes counted: %v", res, m)
		}
	}
	// Serving is unaffected.
	if resp, b := c.chat(chatBody("qwen3-8b", true, [2]string{"user", "still served"})); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
}

// metricsFront puts a front before sim that answers /metrics with metrics
// and proxies everything else to the engine; it returns its dial address.
func metricsFront(t *testing.T, sim *enginesim.Server, metrics http.HandlerFunc) string {
	t.Helper()
	u, _ := url.Parse(sim.URL())
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			metrics(w, r)
			return
		}
		// The body is read whole first: the HTTP/1.x server closes the
		// request body once the response starts, and the proxy's
		// transport, still reading it for its EOF when the engine
		// answers a stream, would then close its connection mid-stream
		// (the test's stream ended in "unexpected EOF" about 1 run in 100).
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
