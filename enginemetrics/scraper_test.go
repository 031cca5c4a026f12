package enginemetrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// engine is a /metrics endpoint on 127.0.0.1 whose behaviour a test
// switches at run time.
type engine struct {
	srv  *httptest.Server
	mode atomic.Value // string
	page atomic.Value // string
	auth atomic.Value // string: the last Authorization header
	hits atomic.Int64
	stop chan struct{}
}

func newEngine(t *testing.T, page string) *engine {
	t.Helper()
	e := &engine{stop: make(chan struct{})}
	e.mode.Store("ok")
	e.page.Store(page)
	e.auth.Store("")
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(func() {
		close(e.stop)
		e.srv.Close()
	})
	return e
}

func (e *engine) serve(w http.ResponseWriter, r *http.Request) {
	e.hits.Add(1)
	e.auth.Store(r.Header.Get("Authorization"))
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	switch e.mode.Load().(string) {
	case "ok":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(e.page.Load().(string)))
	case "garbage":
		_, _ = w.Write([]byte("<html>\x00\x01 not metrics {{{"))
	case "500":
		http.Error(w, "engine dead", http.StatusInternalServerError)
	case "stall-headers":
		select { // hold the request until the client gives up
		case <-r.Context().Done():
		case <-e.stop:
		}
	case "stall-body":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("vllm:num_requests_running{engine=\"0\"} 1\n"))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-e.stop:
		}
	case "huge":
		// Chunked, no Content-Length: the limit must hold while reading.
		line := []byte("vllm:num_requests_running{engine=\"0\"} 1\n# padding padding padding padding padding\n")
		for i := 0; i < (8<<20)/len(line); i++ {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	case "huge-length":
		w.Header().Set("Content-Length", fmt.Sprint(64<<20))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("vllm:num_requests_running 1\n"))
	}
}

func (e *engine) url() string { return e.srv.URL + "/metrics" }

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newScraper(t *testing.T, cfg Config) *Scraper {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestScraperResults(t *testing.T) {
	page := readTestdata(t, "vllm_dp2.txt")
	tests := []struct {
		mode    string
		want    Result
		wantErr string
	}{
		{"ok", ResultOK, ""},
		{"garbage", ResultParse, "parsing metrics"},
		{"500", ResultStatus, "status 500"},
		{"stall-headers", ResultTimeout, "scraping metrics"},
		{"stall-body", ResultTimeout, "reading metrics"},
		{"huge", ResultTooLarge, "exceeds"},
		{"huge-length", ResultTooLarge, "exceeds"},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			e := newEngine(t, page)
			e.mode.Store(tt.mode)
			timeout := 20 * time.Second // a loaded machine must still read 1 MiB in time
			if strings.HasPrefix(tt.mode, "stall") {
				timeout = 300 * time.Millisecond
			}
			s := newScraper(t, Config{Interval: time.Second, Timeout: timeout,
				MaxBodyBytes: 1 << 20, Token: "sekrit"})
			s.SetTargets([]Target{{URL: e.url(), Replicas: []ReplicaRef{{Key: "a#0", ID: "id0", Rank: 0}, {Key: "a#1", ID: "id1", Rank: 1}}}})
			start := time.Now()
			s.ScrapeOnce(context.Background())
			if el := time.Since(start); el > 30*time.Second {
				t.Fatalf("scrape took %v: the timeout did not hold", el)
			}
			res := s.Results()
			if res[tt.want] != 1 {
				t.Fatalf("results = %v, want one %v", res, tt.want)
			}
			if got := e.auth.Load().(string); got != "Bearer sekrit" {
				t.Fatalf("Authorization = %q", got)
			}
			sn, ok := s.Snapshot("a#1")
			if !ok {
				t.Fatal("no snapshot")
			}
			if tt.wantErr == "" {
				if sn.Err != "" || sn.Metrics.Running != 3 || sn.Metrics.KVCapacityTokens != 8192*16 || sn.Engine != EngineVLLM {
					t.Fatalf("snapshot = %+v", sn)
				}
				if st := sn.State(time.Now()); st != StateOK {
					t.Fatalf("state %v", st)
				}
				return
			}
			if !strings.Contains(sn.Err, tt.wantErr) || sn.Failures != 1 || !sn.ScrapedAt.IsZero() {
				t.Fatalf("snapshot = %+v, want error containing %q", sn, tt.wantErr)
			}
			if st := sn.State(time.Now()); st != StateStale {
				t.Fatalf("state %v, want stale (never scraped well)", st)
			}
			if ext := Fuse(sn, time.Now()); ext.Fresh || ext.Requests() != 0 {
				t.Fatalf("fused %+v from a failed scrape", ext)
			}
		})
	}
}

func TestScraperConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/metrics"
	srv.Close() // nothing listens there now
	s := newScraper(t, Config{Timeout: time.Second})
	s.SetTargets([]Target{{URL: url, Replicas: []ReplicaRef{{Key: "gone", Rank: -1}}}})
	s.ScrapeOnce(context.Background())
	if res := s.Results(); res[ResultError] != 1 {
		t.Fatalf("results %v", res)
	}
}

// A failing engine keeps its last good figures for StaleAfter intervals,
// then falls back to local reservations; a good scrape brings it back.
func TestScraperStaleness(t *testing.T) {
	e := newEngine(t, readTestdata(t, "vllm_dp2.txt"))
	clk := newClock()
	var local atomic.Int64
	s := newScraper(t, Config{Interval: time.Second, StaleAfter: 3, Timeout: time.Second, Now: clk.now,
		Local: func(key string) Local { return Local{Inflight: local.Load()} }})
	s.SetTargets([]Target{{URL: e.url(), Replicas: []ReplicaRef{{Key: "r", ID: "x", Rank: 0}}}})
	local.Store(4)
	s.ScrapeOnce(context.Background())
	sn, _ := s.Snapshot("r")
	if sn.State(clk.now()) != StateOK || sn.Local.Inflight != 4 {
		t.Fatalf("snapshot %+v", sn)
	}
	// rank 0: 7 running + 2 waiting, 4 of them ours.
	ext := Fuse(sn, clk.now())
	if !ext.Fresh || ext.Requests() != 5 || ext.Waiting != 1 || ext.Running != 4 || ext.KVCapacityTokens != 12288*16 {
		t.Fatalf("fused %+v", ext)
	}

	e.mode.Store("garbage")
	for i := 1; i <= 3; i++ {
		clk.advance(time.Second)
		s.ScrapeOnce(context.Background())
		sn, _ = s.Snapshot("r")
		if st := sn.State(clk.now()); st != StateError || sn.Failures != i {
			t.Fatalf("after %d failures: state %v, %+v", i, st, sn)
		}
		if ext := Fuse(sn, clk.now()); !ext.Fresh || ext.Requests() != 5 {
			t.Fatalf("within stale_after the last good figures are used: %+v", ext)
		}
	}
	clk.advance(time.Second + time.Millisecond)
	sn, _ = s.Snapshot("r")
	if st := sn.State(clk.now()); st != StateStale {
		t.Fatalf("state %v after %v, want stale", st, clk.now().Sub(sn.ScrapedAt))
	}
	ext = Fuse(sn, clk.now())
	if ext.Fresh || ext.Requests() != 0 || ext.KVUsedTokens != 0 || ext.KVCapacityTokens != 12288*16 {
		t.Fatalf("stale fused %+v: want local only, capacity kept", ext)
	}

	e.mode.Store("ok")
	local.Store(0)
	s.ScrapeOnce(context.Background())
	sn, _ = s.Snapshot("r")
	if st := sn.State(clk.now()); st != StateOK || sn.Failures != 0 {
		t.Fatalf("recovered: %v %+v", st, sn)
	}
	if ext := Fuse(sn, clk.now()); ext.Requests() != 9 {
		t.Fatalf("fused %+v", ext)
	}
}

// Start scrapes on the interval; Close stops the goroutine even while a
// scrape is stalled.
func TestScraperStartClose(t *testing.T) {
	e := newEngine(t, readTestdata(t, "sglang.txt"))
	var updates atomic.Int64
	s, err := New(Config{Interval: 20 * time.Millisecond, Timeout: 5 * time.Second,
		OnSnapshot: func(Snapshot) { updates.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	s.SetTargets([]Target{{URL: e.url(), Replicas: []ReplicaRef{{Key: "s", Rank: -1}}}})
	s.Start(context.Background())
	s.Start(context.Background()) // a second Start does nothing
	eventually(t, "three scrapes", func() bool { return updates.Load() >= 3 })
	sn, _ := s.Snapshot("s")
	if sn.Engine != EngineSGLang || sn.Metrics.KVCapacityTokens != 161721 || sn.Metrics.Running != 5 {
		t.Fatalf("snapshot %+v", sn)
	}
	e.mode.Store("stall-headers")
	hits := e.hits.Load()
	eventually(t, "a stalled scrape", func() bool { return e.hits.Load() > hits })
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close hung on a stalled scrape")
	}
	if res := s.Results(); res[ResultTimeout] != 0 {
		t.Fatalf("a scrape cut by Close counted as a timeout: %v", res)
	}
}

// Concurrency bounds the scrapes in flight.
func TestScraperConcurrency(t *testing.T) {
	var inflight, peak atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = w.Write([]byte("vllm:num_requests_running 1\n"))
	}))
	defer srv.Close()
	s := newScraper(t, Config{Concurrency: 3, Timeout: 20 * time.Second})
	var ts []Target
	for i := range 6 {
		// One server per target, as engines are.
		o := httptest.NewServer(srv.Config.Handler)
		defer o.Close()
		ts = append(ts, Target{URL: o.URL + "/metrics", Replicas: []ReplicaRef{{Key: fmt.Sprint(i), Rank: -1}}})
	}
	s.SetTargets(ts)
	done := make(chan struct{})
	go func() { s.ScrapeOnce(context.Background()); close(done) }()
	eventually(t, "three scrapes in flight", func() bool { return inflight.Load() == 3 })
	close(release)
	<-done
	if p := peak.Load(); p != 3 {
		t.Fatalf("peak in flight %d, want 3", p)
	}
	if res := s.Results(); res[ResultOK] != 6 {
		t.Fatalf("results %v", res)
	}
}

func TestSetTargetsKeepsAndDrops(t *testing.T) {
	e := newEngine(t, readTestdata(t, "sglang.txt"))
	s := newScraper(t, Config{})
	s.SetTargets([]Target{{URL: e.url(), Replicas: []ReplicaRef{{Key: "a", Rank: -1}, {Key: "b", Rank: -1}}}})
	s.ScrapeOnce(context.Background())
	s.SetTargets([]Target{{URL: e.url(), Replicas: []ReplicaRef{{Key: "a", ID: "new", Rank: -1}}}})
	if _, ok := s.Snapshot("b"); ok {
		t.Fatal("dropped replica kept")
	}
	sn, ok := s.Snapshot("a")
	if !ok || sn.ScrapedAt.IsZero() || sn.ID != "new" {
		t.Fatalf("kept replica lost its snapshot: %+v", sn)
	}
	if got := len(s.Snapshots()); got != 1 {
		t.Fatalf("%d snapshots", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Interval: -1}, {Timeout: -1}, {MaxBodyBytes: -1}, {Concurrency: -1}, {StaleAfter: -1}} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
	s, err := New(Config{Interval: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := s.Config()
	if c.Timeout != 5*time.Second || c.MaxBodyBytes != DefaultMaxBodyBytes || c.Concurrency != DefaultConcurrency || c.StaleAfter != DefaultStaleAfter {
		t.Fatalf("defaults %+v", c)
	}
}

func TestCollector(t *testing.T) {
	e := newEngine(t, readTestdata(t, "vllm_dp2.txt"))
	clk := newClock()
	s := newScraper(t, Config{Interval: time.Second, Now: clk.now})
	s.SetTargets([]Target{{URL: e.url(), Replicas: []ReplicaRef{
		{Key: "a#0", ID: "id0", Rank: 0}, {Key: "a#1", ID: "id1", Rank: 1}, {Key: "a#2", ID: "id2", Rank: 2}}}})
	s.ScrapeOnce(context.Background())
	c := NewCollector()
	c.now = clk.now
	c.Add(s, "default")
	want := `
# HELP ramjet_engine_fallback_replicas Replicas without a usable engine scrape (stale or never scraped), routed by local reservations only.
# TYPE ramjet_engine_fallback_replicas gauge
ramjet_engine_fallback_replicas{fleet="default"} 1
# HELP ramjet_engine_running_requests Requests in the engine's running batch at the last good scrape.
# TYPE ramjet_engine_running_requests gauge
ramjet_engine_running_requests{fleet="default",upstream="id0"} 7
ramjet_engine_running_requests{fleet="default",upstream="id1"} 3
# HELP ramjet_engine_kv_capacity_tokens The engine's KV cache capacity in tokens (0: not reported).
# TYPE ramjet_engine_kv_capacity_tokens gauge
ramjet_engine_kv_capacity_tokens{fleet="default",upstream="id0"} 196608
ramjet_engine_kv_capacity_tokens{fleet="default",upstream="id1"} 131072
# HELP ramjet_engine_scrapes_total Scrapes of the engines' /metrics by result: ok, timeout, error, status, too_large, parse.
# TYPE ramjet_engine_scrapes_total counter
ramjet_engine_scrapes_total{fleet="default",result="error"} 0
ramjet_engine_scrapes_total{fleet="default",result="ok"} 1
ramjet_engine_scrapes_total{fleet="default",result="parse"} 0
ramjet_engine_scrapes_total{fleet="default",result="status"} 0
ramjet_engine_scrapes_total{fleet="default",result="timeout"} 0
ramjet_engine_scrapes_total{fleet="default",result="too_large"} 0
# HELP ramjet_engine_stale 1 when the replica has no good engine scrape within stale_after intervals (routed by local reservations only).
# TYPE ramjet_engine_stale gauge
ramjet_engine_stale{fleet="default",upstream="id0"} 0
ramjet_engine_stale{fleet="default",upstream="id1"} 0
ramjet_engine_stale{fleet="default",upstream="id2"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "ramjet_engine_fallback_replicas",
		"ramjet_engine_running_requests", "ramjet_engine_kv_capacity_tokens", "ramjet_engine_scrapes_total",
		"ramjet_engine_stale"); err != nil {
		t.Fatal(err)
	}
	if probs, err := testutil.CollectAndLint(c); err != nil || len(probs) > 0 {
		t.Fatalf("lint: %v %v", err, probs)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	c.Remove(s)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("after Remove: %d series, %v", n, err)
	}
}

// eventually polls cond every 5ms until it holds, failing after 20s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
