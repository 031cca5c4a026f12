package metrics

import (
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/ramjet-llm/ramjet/catalog"
	"github.com/ramjet-llm/ramjet/dashboard"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/usage"
)

// TestSeriesLazyAndReset: what a request adds shows at scrape, the
// series of finished requests are created on first use only (no series
// appears before its first observation), and Reset drops the records and
// counters, so that what follows a reset counts again.
func TestSeriesLazyAndReset(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	request := func() {
		m.ObserveSelection("00aa", selection.Decision{Index: 0, Reason: selection.ReasonAffinity}, false, time.Microsecond)
		l := m.StartRequest("00aa", "m")
		now := time.Now()
		m.EndRequest(l, &Exchange{Upstream: "00aa", Model: "m", Status: 200, Start: now, End: now.Add(time.Millisecond),
			Usage: usage.Usage{PromptTokens: 10, CachedTokens: 4, CompletionTokens: 2}, HasUsage: true})
	}
	if n := testutil.CollectAndCount(m.Requests, "ramjet_responses_without_usage_total"); n != 0 {
		t.Fatalf("%d responses_without_usage series before any response without usage", n)
	}
	request()
	request()
	if got, _ := m.Value("requests_total", "upstream", "00aa", "model", "m", "outcome", OutcomeOK); got != 2 {
		t.Fatalf("requests_total = %v, want 2", got)
	}
	if got, _ := m.Value("prompt_tokens_total", "upstream", "00aa", "model", "m"); got != 20 {
		t.Fatalf("prompt_tokens_total = %v, want 20", got)
	}
	if got, _ := m.Value("routing_decisions_total", "upstream", "00aa", "reason", "affinity"); got != 2 {
		t.Fatalf("routing_decisions_total = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(m.Requests, "ramjet_responses_without_usage_total"); n != 0 {
		t.Fatalf("%d responses_without_usage series, want none (every response had usage)", n)
	}
	m.Reset()
	if n := testutil.CollectAndCount(m.Requests, "ramjet_requests_total"); n != 0 {
		t.Fatalf("%d requests_total series after Reset", n)
	}
	request()
	if got, _ := m.Value("requests_total", "upstream", "00aa", "model", "m", "outcome", OutcomeOK); got != 1 {
		t.Fatalf("requests_total after Reset = %v, want 1 (a stale cached child?)", got)
	}
	if got, ok := m.Value("model_inflight_requests", "model", "m"); got != 0 || !ok {
		t.Fatalf("model_inflight_requests = %v, want 0", got)
	}
}

// TestDecisionsConcurrent: concurrent first uses of new label values
// all land in the series (run with -race).
func TestDecisionsConcurrent(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				for _, id := range ids {
					m.ObserveSelection(id, selection.Decision{Index: 0, Reason: selection.ReasonCold}, false, time.Microsecond)
				}
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if got, _ := m.Value("routing_decisions_total", "upstream", id, "reason", "cold"); got != 200 {
			t.Errorf("decisions{%s} = %v, want 200", id, got)
		}
	}
	m.ObserveSelection("", selection.Decision{Index: -1}, false, 0)
	m.ObserveSelection("a", selection.Decision{}, true, 0)
	s := m.DashboardSample(time.Now())
	if s.Reasons["cold"] != 1600 || s.Reasons["none"] != 1 || s.Reasons["fallback"] != 1 || len(s.Reasons) != 3 {
		t.Errorf("the dashboard's reasons %v, want cold 1600, none 1, fallback 1", s.Reasons)
	}
	if len(s.Up) != len(ids) || s.Up["a"].Reasons["cold"] != 200 || s.Up["a"].Reasons["fallback"] != 1 {
		t.Errorf("the dashboard's upstreams %d (want %d, no \"\"), a's reasons %v", len(s.Up), len(ids), s.Up["a"].Reasons)
	}
}

// TestDashboardSampleFromRecords: the dashboard's counts are the records'
// (requests, errors, tokens of routed requests, TTFT of routed streams),
// grouped by model ("" as "unknown") and upstream.
func TestDashboardSampleFromRecords(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	m.Models.Add("m")
	now := time.Now()
	u := usage.Usage{PromptTokens: 10, CachedTokens: 4, CompletionTokens: 2}
	for _, x := range []Exchange{
		{Upstream: "aa", Model: "m", Status: 200, HasUsage: true, Usage: u, Stream: true, FirstByte: now.Add(7 * time.Millisecond)},
		{Upstream: "aa", Model: "m", Status: 500},
		{Upstream: "bb", Model: "m", Status: 200, HasUsage: true, Usage: u, Stream: true, FirstByte: now.Add(2 * time.Second)},
		{Upstream: "", Model: "", Status: 400, HasUsage: true, Usage: u},
		{Upstream: "bb", Model: "", Status: 200},
	} {
		x.Start, x.End = now, now.Add(3*time.Second)
		m.EndRequest(m.StartRequest(x.Upstream, x.Model), &x)
	}
	s := m.DashboardSample(now)
	if want := (dashboard.Counts{Requests: 5, Errors: 2, Prompt: 20, Cached: 8, Output: 4}); s.All != want {
		t.Errorf("all %+v, want %+v", s.All, want)
	}
	if got := s.Model["unknown"]; got == nil || got.Requests != 2 || got.Errors != 1 || got.Prompt != 0 {
		t.Errorf("model unknown %+v, want 2 requests, 1 error, no tokens (the unrouted one's are not counted)", got)
	}
	if got := s.Up["aa"]; got == nil || got.Requests != 2 || got.Errors != 1 || got.Prompt != 10 {
		t.Errorf("upstream aa %+v", got)
	}
	if got := s.Up["bb"]; got == nil || got.Requests != 2 || got.Prompt != 10 || len(s.Up) != 2 {
		t.Errorf("upstream bb %+v, %d upstreams", got, len(s.Up))
	}
	c := s.TTFT.Counts
	if n := len(c); n != len(dashboard.TTFTBounds)+1 || c[0] != 0 || c[1] != 1 || c[n-1] != 2 || c[slices.Index(dashboard.TTFTBounds, 2.5)] != 2 || c[slices.Index(dashboard.TTFTBounds, 1)] != 1 {
		t.Errorf("TTFT counts %v, want cumulative: 7 ms in (5, 10] ms, 2 s in (1, 2.5] s", c)
	}
}

// BenchmarkEndRequest is one routed request's metrics: the decision, the
// request in flight and its end with usage.
func BenchmarkEndRequest(b *testing.B) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	now := time.Now()
	x := &Exchange{Upstream: "00aa11bb22cc", Model: "m", Status: 200, Start: now, End: now.Add(time.Millisecond),
		Usage: usage.Usage{PromptTokens: 10, CachedTokens: 4, CompletionTokens: 2}, HasUsage: true}
	d := selection.Decision{Index: 0, Reason: selection.ReasonAffinity}
	b.ReportAllocs()
	for b.Loop() {
		m.ObserveSelection(x.Upstream, d, false, time.Microsecond)
		m.EndRequest(m.StartRequest(x.Upstream, "m"), x)
	}
}

// reference is the labelled vectors the series of finished requests were
// kept in before their records (the same options), registered with the
// rest of a Set's collectors.
type reference struct {
	*Set
	Decisions, TieBreaks, Requests, PromptTokens, CachedTokens, OutputTokens, NoUsage *prometheus.CounterVec
	Inflight                                                                          *prometheus.GaugeVec
	Overlap, SelectTime                                                               prometheus.Histogram
	TTFT, Duration                                                                    *prometheus.HistogramVec
	reg                                                                               *prometheus.Registry
}

func newReference(m *Set) *reference {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	r := &reference{Set: m, reg: prometheus.NewPedanticRegistry(),
		TieBreaks: counter("tie_breaks_total", "Routing decisions settled by a tie-break, by the rule that decided (depth, profile, rendezvous, load, order).", "rule"),
		Decisions: counter("routing_decisions_total", "Routing decisions of the ramjet policy, by chosen upstream and reason (affinity, load_override, cold, tie_break, fallback, panic, none).", "upstream", "reason"),
		Overlap: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "prefix_overlap_tokens",
			Help:    "Estimated prompt-prefix overlap with the chosen upstream's cache at decision time, in tokens.",
			Buckets: []float64{0, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768},
		}),
		SelectTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "selection_duration_seconds",
			Help:    "Time the ramjet policy spent choosing an upstream (fingerprint, score, pick), in seconds.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 9),
		}),
		Inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "model_inflight_requests",
			Help: "Requests in flight through ramjet, by model."}, []string{"model"}),
		Requests:     counter("requests_total", "Requests that ended, by upstream, model and outcome (ok, client_error, upstream_error, no_replica, canceled).", "upstream", "model", "outcome"),
		PromptTokens: counter("prompt_tokens_total", "Prompt tokens reported in the engines' response usage, by upstream and model.", "upstream", "model"),
		CachedTokens: counter("cached_prompt_tokens_total", "Prompt tokens the engines served from their prefix cache (usage cached_tokens), by upstream and model.", "upstream", "model"),
		OutputTokens: counter("completion_tokens_total", "Completion (output) tokens reported in the engines' response usage, by upstream and model.", "upstream", "model"),
		NoUsage:      counter("responses_without_usage_total", "Successful responses that carried no usage object (e.g. a stream without stream_options.include_usage), by upstream.", "upstream"),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "time_to_first_token_seconds",
			Help:    "Time from the request reaching ramjet to the first byte of a streamed response, by upstream, in seconds.",
			Buckets: dashboard.TTFTBounds,
		}, []string{"upstream"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "request_duration_seconds",
			Help:    "Time from the request reaching ramjet to the end of its response, by upstream, in seconds.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"upstream"}),
	}
	r.reg.MustRegister(r.Decisions, r.TieBreaks, r.Overlap, r.SelectTime, r.Inflight, m.Fleet, bodyBuffers{}, freeLists{}, usageLayouts{},
		r.Requests, r.PromptTokens, r.CachedTokens, r.OutputTokens, r.NoUsage, r.TTFT, r.Duration)
	return r
}

// Reset resets the Set and the reference vectors.
func (r *reference) Reset() {
	r.Set.Reset()
	for _, v := range []interface{ Reset() }{r.Decisions, r.TieBreaks, r.Inflight, r.Requests, r.PromptTokens, r.CachedTokens, r.OutputTokens, r.NoUsage, r.TTFT, r.Duration} {
		v.Reset()
	}
}

// observeSelectionReference is ObserveSelection on the reference's vectors.
func observeSelectionReference(m *reference, upstream string, d selection.Decision, fallback bool, took time.Duration) {
	m.Decisions.WithLabelValues(upstream, ReasonLabel(d, fallback)).Inc()
	if fallback || d.Index < 0 {
		return
	}
	m.SelectTime.Observe(took.Seconds())
	m.Overlap.Observe(float64(d.Overlap))
	if d.Tie > selection.TieNone {
		m.TieBreaks.WithLabelValues(d.Tie.String()).Inc()
	}
}

// endRequestReference is EndRequest's Prometheus part as it was before
// the records: every child through its vector's WithLabelValues.
func endRequestReference(m *reference, in Inflight, x *Exchange) {
	m.Inflight.WithLabelValues(in.p.model).Dec()
	outcome := OutcomeOf(x.Status, x.Canceled, x.NoReplica)
	var model string
	if outcome == OutcomeOK {
		model = m.Models.Add(x.Model)
	} else {
		model = m.Models.Label(x.Model)
	}
	defer m.Requests.WithLabelValues(x.Upstream, model, outcome).Inc()
	if x.Upstream == "" {
		return
	}
	if x.HasUsage {
		m.PromptTokens.WithLabelValues(x.Upstream, model).Add(float64(x.Usage.PromptTokens))
		m.CachedTokens.WithLabelValues(x.Upstream, model).Add(float64(x.Usage.CachedTokens))
		m.OutputTokens.WithLabelValues(x.Upstream, model).Add(float64(x.Usage.CompletionTokens))
	} else if outcome == OutcomeOK {
		m.NoUsage.WithLabelValues(x.Upstream).Inc()
	}
	if x.Stream && !x.FirstByte.IsZero() {
		m.TTFT.WithLabelValues(x.Upstream).Observe(x.FirstByte.Sub(x.Start).Seconds())
	}
	if !x.End.IsZero() {
		m.Duration.WithLabelValues(x.Upstream).Observe(x.End.Sub(x.Start).Seconds())
	}
}

// TestPairSeriesMatchesReference: decisions of every reason, tie and
// fallback, and requests of every outcome, with and
// without usage, streamed or not, with and without an upstream, on several
// (upstream, model) pairs and across a Reset, give the same exposition
// through EndRequest's records as through the labelled vectors they
// replace (no series early, none missing, the same names, help, types,
// labels and values).
func TestPairSeriesMatchesReference(t *testing.T) {
	snap := func() []fleetstate.Snapshot { return nil }
	got, want := NewSet(snap, catalog.NewNames(2)), newReference(NewSet(snap, catalog.NewNames(2)))
	start := time.Unix(1000, 0)
	var xs []Exchange
	for i := range 60 {
		x := Exchange{Upstream: []string{"00aa", "00bb", ""}[i%3], Model: []string{"m", "n", "o"}[i/3%3],
			Status: []int{200, 200, 404, 502, 200}[i%5], Canceled: i%7 == 3, NoReplica: i%11 == 5,
			Stream: i%2 == 0, Start: start}
		if i%4 != 1 {
			x.End = start.Add(time.Duration(i) * 10 * time.Millisecond)
		}
		if i%3 != 2 {
			x.FirstByte = start.Add(time.Duration(i) * time.Millisecond)
		}
		if i%5 < 3 {
			x.HasUsage, x.Usage = true, usage.Usage{PromptTokens: int64(i), CachedTokens: int64(i / 2), CompletionTokens: 1}
		}
		xs = append(xs, x)
	}
	run := func(xs []Exchange) {
		for i, x := range xs {
			gx, wx := x, x
			d := selection.Decision{Index: i%9 - 1, Reason: selection.Reason(i % 5), Tie: selection.TieRule(i % 4), Overlap: i * 97 % 3000}
			took := time.Duration(i*i) * 300 * time.Nanosecond
			observeSelectionReference(want, x.Upstream, d, i%6 == 4, took)
			got.ObserveSelection(x.Upstream, d, i%6 == 4, took)
			in := want.StartRequest(x.Upstream, x.Model)
			want.Inflight.WithLabelValues(in.p.model).Inc()
			endRequestReference(want, in, &wx)
			got.EndRequest(got.StartRequest(x.Upstream, x.Model), &gx)
		}
	}
	compare := func(when string) {
		t.Helper()
		format := func(g prometheus.Gatherer) string {
			mfs, err := g.Gather()
			if err != nil {
				t.Fatal(err)
			}
			var sb strings.Builder
			for _, mf := range mfs {
				if _, err := expfmt.MetricFamilyToText(&sb, mf); err != nil {
					t.Fatal(err)
				}
			}
			if !strings.Contains(sb.String(), "ramjet_requests_total{") {
				t.Fatalf("no requests in the exposition:\n%s", sb.String())
			}
			return sb.String()
		}
		if g, w := format(got.Own), format(want.reg); g != w {
			t.Fatalf("%s: exposition differs:\n--- records\n%s\n--- reference\n%s", when, g, w)
		}
		// The created timestamps (OpenMetrics' _created, protobuf): on the
		// same series, when the series appeared.
		created := func(g prometheus.Gatherer) map[string]bool {
			mfs, err := g.Gather()
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]bool{}
			for _, mf := range mfs {
				for _, s := range mf.GetMetric() {
					ct := s.GetCounter().GetCreatedTimestamp()
					if ct == nil {
						ct = s.GetHistogram().GetCreatedTimestamp()
					}
					if ct != nil && !ct.AsTime().Before(start) {
						key := mf.GetName()
						for _, l := range s.GetLabel() {
							key += "," + l.GetName() + "=" + l.GetValue()
						}
						out[key] = true
					}
				}
			}
			return out
		}
		if g, w := created(got.Own), created(want.reg); !maps.Equal(g, w) {
			t.Fatalf("%s: created timestamps on %d series, want %d", when, len(g), len(w))
		}
	}
	run(xs[:20])
	compare("first 20")
	run(xs[20:])
	compare("all 60")
	got.Reset()
	want.Reset()
	run(xs[30:45])
	compare("after Reset")
}

// TestRecordsConcurrentScrape: requests ending on several goroutines while
// the registry is scraped add up at the end (run with -race): every
// request counted once, every duration observed once.
func TestRecordsConcurrentScrape(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4))
	ups := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	start := time.Now()
	var wg sync.WaitGroup
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			default:
				if _, err := m.Own.Gather(); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				up := ups[(g+i)%len(ups)]
				m.ObserveSelection(up, selection.Decision{Index: 0, Reason: selection.ReasonAffinity, Tie: selection.TieLoad}, false, time.Microsecond)
				m.EndRequest(m.StartRequest(up, "m"), &Exchange{Upstream: up, Model: "m", Status: 200, Start: start, End: start.Add(time.Duration(i) * time.Millisecond),
					Usage: usage.Usage{PromptTokens: 3, CachedTokens: 1, CompletionTokens: 1}, HasUsage: true})
			}
		}()
	}
	wg.Wait()
	close(done)
	var reqs, durations, prompt float64
	for _, up := range ups {
		n, _ := m.Value("requests_total", "upstream", up, "model", "m", "outcome", OutcomeOK)
		d, _ := m.Value("request_duration_seconds", "upstream", up)
		p, _ := m.Value("prompt_tokens_total", "upstream", up, "model", "m")
		reqs, durations, prompt = reqs+n, durations+d, prompt+p
	}
	ties, _ := m.Value("tie_breaks_total", "rule", "load")
	if reqs != 800 || durations != 800 || prompt != 2400 || ties != 800 {
		t.Errorf("requests %v, durations %v, prompt tokens %v, ties %v; want 800, 800, 2400, 800", reqs, durations, prompt, ties)
	}
}

// TestHistBucketMatchesSearch: hist.observe's bucket is
// sort.SearchFloat64s's for every bound list, at, between and past the
// bounds, and for NaN and the infinities.
func TestHistBucketMatchesSearch(t *testing.T) {
	for _, bounds := range [][]float64{durationBounds, selectBounds, overlapBounds, dashboard.TTFTBounds} {
		vals := []float64{math.NaN(), math.Inf(-1), math.Inf(1), -1, 0}
		for _, b := range bounds {
			vals = append(vals, b, math.Nextafter(b, math.Inf(-1)), math.Nextafter(b, math.Inf(1)), b*1.5)
		}
		for _, v := range vals {
			var h hist
			h.observe(bounds, v)
			want := sort.SearchFloat64s(bounds, v)
			for i := range h.buckets {
				if n := h.buckets[i].Load(); n != 0 && i != want || i == want && n != 1 {
					t.Fatalf("bounds %v, value %v: bucket %d holds %d, want the one in bucket %d", bounds, v, i, n, want)
				}
			}
		}
	}
}

// TestInflightPairEnd: a request counted in flight on its first attempt's
// pair ends on the pair of its final upstream and model label: a retry
// elsewhere, or a model that joined the labels on its success, counts
// there, and the in-flight count goes back on the first pair.
func TestInflightPairEnd(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4, "m"))
	in := m.StartRequest("aa", "m")
	if got, _ := m.Value("model_inflight_requests", "model", "m"); got != 1 {
		t.Fatalf("in flight %v, want 1", got)
	}
	m.EndRequest(in, &Exchange{Upstream: "bb", Model: "m", Status: 200}) // retried on bb
	in = m.StartRequest("aa", "new")                                     // "other" at its start
	m.EndRequest(in, &Exchange{Upstream: "aa", Model: "new", Status: 200})
	for _, tc := range []struct {
		up, model string
		want      float64
	}{{"bb", "m", 1}, {"aa", "m", 0}, {"aa", "new", 1}, {"aa", catalog.Other, 0}} {
		if got, _ := m.Value("requests_total", "upstream", tc.up, "model", tc.model, "outcome", OutcomeOK); got != tc.want {
			t.Errorf("requests_total{%s,%s} = %v, want %v", tc.up, tc.model, got, tc.want)
		}
	}
	for _, model := range []string{"m", catalog.Other} {
		if got, ok := m.Value("model_inflight_requests", "model", model); got != 0 || !ok {
			t.Errorf("model_inflight_requests{%s} = %v (%v), want 0", model, got, ok)
		}
	}
}

// TestEndRequestAllocs: a routed request's metrics (decision, in flight,
// end) allocate nothing once its pair exists.
func TestEndRequestAllocs(t *testing.T) {
	m := NewSet(func() []fleetstate.Snapshot { return nil }, catalog.NewNames(4, "m"))
	now := time.Now()
	x := &Exchange{Upstream: "aa", Model: "m", Status: 200, Start: now, End: now.Add(time.Millisecond),
		Usage: usage.Usage{PromptTokens: 10}, HasUsage: true, Stream: true, FirstByte: now.Add(time.Microsecond)}
	d := selection.Decision{Index: 0, Reason: selection.ReasonAffinity}
	request := func() {
		m.ObserveSelection(x.Upstream, d, false, time.Microsecond)
		m.EndRequest(m.StartRequest(x.Upstream, x.Model), x)
	}
	request()
	if n := testing.AllocsPerRun(100, request); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
}
