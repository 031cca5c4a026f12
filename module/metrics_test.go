package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/metrics"
)

// resetMetrics clears the process's request-path series, so that a test
// sees only its own requests. Histograms without labels cannot be reset;
// tests read their deltas.
func resetMetrics() {
	processMetrics().Reset()
}

// seriesValue is the value of the series ramjet_<name>{labelPairs} as a
// scrape of m sees it, 0 when it does not exist.
func seriesValue(m *metrics.Set, name string, labelPairs ...string) float64 {
	v, _ := m.Value(name, labelPairs...)
	return v
}

// requestsTotal is ramjet_requests_total{upstream, model, outcome} of m.
func requestsTotal(m *metrics.Set, upstream, model, outcome string) float64 {
	return seriesValue(m, "requests_total", "upstream", upstream, "model", model, "outcome", outcome)
}

func histCount(t *testing.T, g prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func mustGather(t *testing.T, g prometheus.Gatherer) []*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// TestMetricsRegisterTwice: several ramjet modules in one config register
// the same collectors; the second registration is tolerated.
func TestMetricsRegisterTwice(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for range 2 {
		if err := registerMetrics(reg); err != nil {
			t.Fatal(err)
		}
	}
	if err := registerMetrics(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("gather: %v", err)
	}
}

// obsExchange sends body and returns the replica id that served it.
func obsExchange(t *testing.T, c *obsCaddy, body string, wantStatus int) (id string, engine int) {
	t.Helper()
	resp, b := c.chat(body)
	if resp.StatusCode != wantStatus {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, wantStatus, b)
	}
	id = resp.Header.Get(HeaderUpstream)
	if id == "" {
		t.Fatalf("no %s header", HeaderUpstream)
	}
	engine, _ = strconv.Atoi(resp.Header.Get("X-Obs-Engine"))
	return id, engine
}

// TestMetricsScriptedSequence runs a scripted sequence of requests through
// a real Caddy in front of two engines and compares every request-path
// series with what the engines reported; then it reloads the config and
// checks that the values (and what ramjet learned) survived.
func TestMetricsScriptedSequence(t *testing.T) {
	es := startObsEngines(t, 2, 0, 0)
	c := startObsCaddy(t, obsDials(es), obsOpts{})
	resetMetrics()
	m := processMetrics()
	overlap0 := histCount(t, m.Own, "ramjet_prefix_overlap_tokens")
	select0 := histCount(t, m.Own, "ramjet_selection_duration_seconds")

	sysA := obsText("alpha", 2000)
	q1, a1, q2, a2, q3 := "first question", "first answer", "second question", "second answer", "third question"
	idA, engA := obsExchange(t, c, obsChat("m", false, sysA, q1), 200)                     // cold
	if id, _ := obsExchange(t, c, obsChat("m", false, sysA, q1, a1, q2), 200); id != idA { // affinity
		t.Fatalf("turn 2 went to %s, turn 1 to %s", id, idA)
	}
	if id, _ := obsExchange(t, c, obsChat("m", true, sysA, q1, a1, q2, a2, q3), 200); id != idA { // affinity, streamed
		t.Fatalf("turn 3 went to %s, turn 1 to %s", id, idA)
	}
	idR, _ := obsExchange(t, c, obsChat("reject", false, obsText("bravo", 1000), q1), 400)  // cold, 400
	idC, _ := obsExchange(t, c, obsChat("crash", false, obsText("charlie", 1000), q1), 500) // cold, 500
	body := strings.Replace(obsChat("m", true, obsText("delta", 1000), q1), `,"stream_options":{"include_usage":true}`, "", 1)
	if strings.Contains(body, "include_usage") {
		t.Fatalf("body still asks for usage: %s", body)
	}
	idD, _ := obsExchange(t, c, body, 200) // cold, streamed without usage

	// Expected counters, built from the ids the responses carried and the
	// usage the engines reported.
	type key struct{ id, model, outcome string }
	reqs := map[key]int{}
	reqs[key{idA, "m", "ok"}] += 3
	reqs[key{idR, "other", "client_error"}]++
	reqs[key{idC, "other", "upstream_error"}]++
	reqs[key{idD, "m", "ok"}]++
	decisions := map[[2]string]int{}
	decisions[[2]string{idA, "cold"}]++
	decisions[[2]string{idA, "affinity"}] += 2
	decisions[[2]string{idR, "cold"}]++
	decisions[[2]string{idC, "cold"}]++
	decisions[[2]string{idD, "cold"}]++

	var want strings.Builder
	want.WriteString("# HELP ramjet_requests_total Requests that ended, by upstream, model and outcome (ok, client_error, upstream_error, no_replica, canceled).\n# TYPE ramjet_requests_total counter\n")
	for k, n := range reqs {
		fmt.Fprintf(&want, "ramjet_requests_total{model=%q,outcome=%q,upstream=%q} %d\n", k.model, k.outcome, k.id, n)
	}
	want.WriteString("# HELP ramjet_routing_decisions_total Routing decisions of the ramjet policy, by chosen upstream and reason (affinity, load_override, cold, tie_break, fallback, panic, none).\n# TYPE ramjet_routing_decisions_total counter\n")
	for k, n := range decisions {
		fmt.Fprintf(&want, "ramjet_routing_decisions_total{reason=%q,upstream=%q} %d\n", k[1], k[0], n)
	}
	// Usage: engine engA served the conversation (three responses with
	// usage), engD the stream without usage (nothing reported).
	tokens := map[string][3]int64{}
	for i, e := range es {
		_, p, ca, co := e.totals()
		if p == 0 {
			continue
		}
		id := idA
		if i != engA {
			t.Fatalf("engine %d reported usage but served no usage-reporting request (conversation on %d)", i, engA)
		}
		tokens[id] = [3]int64{p, ca, co}
	}
	if tokens[idA][1] == 0 {
		t.Fatalf("the conversation's later turns hit no cache: %v", tokens[idA])
	}
	for _, s := range []struct{ name, help string }{
		{"ramjet_prompt_tokens_total", "Prompt tokens reported in the engines' response usage, by upstream and model."},
		{"ramjet_cached_prompt_tokens_total", "Prompt tokens the engines served from their prefix cache (usage cached_tokens), by upstream and model."},
		{"ramjet_completion_tokens_total", "Completion (output) tokens reported in the engines' response usage, by upstream and model."},
	} {
		fmt.Fprintf(&want, "# HELP %s %s\n# TYPE %s counter\n", s.name, s.help, s.name)
		for id, v := range tokens {
			i := map[string]int{"ramjet_prompt_tokens_total": 0, "ramjet_cached_prompt_tokens_total": 1, "ramjet_completion_tokens_total": 2}[s.name]
			fmt.Fprintf(&want, "%s{model=\"m\",upstream=%q} %d\n", s.name, id, v[i])
		}
	}
	fmt.Fprintf(&want, "# HELP ramjet_responses_without_usage_total Successful responses that carried no usage object (e.g. a stream without stream_options.include_usage), by upstream.\n# TYPE ramjet_responses_without_usage_total counter\nramjet_responses_without_usage_total{upstream=%q} 1\n", idD)

	// The handler accounts a request just after its response went out.
	obsEventually(t, "six requests accounted", func() bool { return fleetGauge(t, m.Own, "ramjet_requests_total") == 6 })
	names := []string{"ramjet_requests_total", "ramjet_routing_decisions_total", "ramjet_prompt_tokens_total",
		"ramjet_cached_prompt_tokens_total", "ramjet_completion_tokens_total", "ramjet_responses_without_usage_total"}
	if err := testutil.GatherAndCompare(m.Own, strings.NewReader(want.String()), names...); err != nil {
		t.Fatalf("after the sequence: %v", err)
	}
	// Two streamed responses: two TTFT observations; six decisions.
	if n := histCount(t, m.Own, "ramjet_time_to_first_token_seconds"); n != 2 {
		t.Errorf("TTFT observations = %d, want 2", n)
	}
	if n := histCount(t, m.Own, "ramjet_request_duration_seconds"); n != 6 {
		t.Errorf("duration observations = %d, want 6", n)
	}
	if n := histCount(t, m.Own, "ramjet_prefix_overlap_tokens") - overlap0; n != 6 {
		t.Errorf("overlap observations = %d, want 6", n)
	}
	if n := histCount(t, m.Own, "ramjet_selection_duration_seconds") - select0; n != 6 {
		t.Errorf("selection latency observations = %d, want 6", n)
	}
	if v := seriesValue(m, "model_inflight_requests", "model", "m"); v != 0 {
		t.Errorf("model in-flight after the sequence = %v, want 0", v)
	}
	probs, err := testutil.GatherAndLint(m.Own)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	// The fleet series: both replicas idle and healthy, the index holds
	// the prompts.
	entries := fleetGauge(t, m.Own, "ramjet_index_entries")
	if entries <= 0 {
		t.Fatalf("ramjet_index_entries = %v", entries)
	}
	if v := fleetGauge(t, m.Own, "ramjet_upstream_inflight_requests"); v != 0 {
		t.Errorf("in flight after the sequence = %v", v)
	}
	if v := fleetGauge(t, m.Own, "ramjet_upstream_available"); v != 2 {
		t.Errorf("available replicas = %v, want 2", v)
	}

	// Both the ops port and the admin API serve the series.
	for _, u := range []string{"http://" + c.ops + "/metrics", "http://" + c.admin + "/metrics"} {
		resp, b := c.do(http.MethodGet, u, "")
		if resp.StatusCode != 200 || !strings.Contains(string(b), "ramjet_requests_total{") || !strings.Contains(string(b), "ramjet_index_entries{") {
			t.Errorf("GET %s: %s without ramjet series:\n%.500s", u, resp.Status, b)
		}
	}

	// Reload: the values, the index and the dashboard's history survive.
	h0 := currentHistory()
	if h0 == nil {
		t.Fatal("no dashboard sampler running")
	}
	c.reload(obsOpts{Tag: "second"})
	if h := currentHistory(); h != h0 {
		t.Errorf("the dashboard's history was replaced by the reload")
	}
	if err := testutil.GatherAndCompare(m.Own, strings.NewReader(want.String()), names...); err != nil {
		t.Fatalf("after a reload: %v", err)
	}
	if v := fleetGauge(t, m.Own, "ramjet_index_entries"); v != entries {
		t.Errorf("index entries after reload = %v, want %v", v, entries)
	}
	if id, _ := obsExchange(t, c, obsChat("m", false, sysA, q1, a1, q2, a2, q3), 200); id != idA {
		t.Fatalf("after the reload the conversation went to %s, before to %s", id, idA)
	}
	wantOK := reqs[key{idA, "m", "ok"}] + 1
	obsEventually(t, "seven requests accounted", func() bool { return fleetGauge(t, m.Own, "ramjet_requests_total") == 7 })
	if got := requestsTotal(m, idA, "m", "ok"); got != float64(wantOK) {
		t.Errorf("requests on %s after reload = %v, want %d", idA, got, wantOK)
	}
	if got := seriesValue(m, "routing_decisions_total", "upstream", idA, "reason", "affinity"); got != 3 {
		t.Errorf("affinity decisions after reload = %v, want 3", got)
	}
	resp, b := c.do(http.MethodGet, "http://"+c.ops+"/metrics", "")
	if !strings.Contains(string(b), fmt.Sprintf(`ramjet_requests_total{model="m",outcome="ok",upstream=%q} %d`, idA, wantOK)) {
		t.Errorf("ops /metrics after reload (%s) lacks the carried-over count:\n%.800s", resp.Status, b)
	}
}

// fleetGauge sums a fleet series over its label values.
func fleetGauge(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	sum := 0.0
	for _, mf := range mustGather(t, g) {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestMetricsNoReplica: with every replica down, the policy finds none and
// the request counts as no_replica.
func TestMetricsNoReplica(t *testing.T) {
	es := startObsEngines(t, 1, 0, 0)
	c := startObsCaddy(t, obsDials(es), obsOpts{Health: true})
	resetMetrics()
	es[0].healthy.Store(false)
	m := processMetrics()
	eventually(t, "the engine seen down", func() bool {
		if fleetGauge(t, m.Own, "ramjet_upstream_healthy") == 0 && fleetGauge(t, m.Own, "ramjet_upstreams") == 1 {
			return true
		}
		// The fleet learns the pool on the first request.
		c.chat(obsChat("m", false, "warmup", "q"))
		return false
	})
	resetMetrics()
	resp, b := c.chat(obsChat("m", false, "sys", "q"))
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", resp.StatusCode, b)
	}
	obsEventually(t, "the request accounted", func() bool { return fleetGauge(t, m.Own, "ramjet_requests_total") == 1 })
	if got := requestsTotal(m, "", "", metrics.OutcomeNoReplica); got != 1 {
		t.Errorf("no_replica requests = %v, want 1", got)
	}
	if got := seriesValue(m, "routing_decisions_total", "upstream", "", "reason", "none"); got != 1 {
		t.Errorf("none decisions = %v, want 1", got)
	}
	if v := fleetGauge(t, m.Own, "ramjet_upstream_healthy"); v != 0 {
		t.Errorf("healthy gauge = %v, want 0", v)
	}
}

// TestMetricsClientGoesAway: a client that drops a stream mid-body counts
// as canceled, and nothing stays in flight.
func TestMetricsClientGoesAway(t *testing.T) {
	es := startObsEngines(t, 1, 0, 0)
	c := startObsCaddy(t, obsDials(es), obsOpts{})
	resetMetrics()
	m := processMetrics()
	req, _ := http.NewRequest(http.MethodPost, "http://"+c.client+"/v1/chat/completions", strings.NewReader(obsChat("m", true, "sys", "q")))
	req.Header.Set("X-Obs-Hold", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	one := make([]byte, 1)
	if _, err := resp.Body.Read(one); err != nil {
		t.Fatal(err)
	}
	if v := fleetGauge(t, m.Own, "ramjet_model_inflight_requests"); v != 1 {
		t.Errorf("in flight during the stream = %v, want 1", v)
	}
	resp.Body.Close() // the client goes away mid-stream
	obsEventually(t, "the canceled request accounted", func() bool { return fleetGauge(t, m.Own, "ramjet_requests_total") == 1 })
	id := resp.Header.Get(HeaderUpstream)
	if got := requestsTotal(m, id, m.Models.Label("m"), metrics.OutcomeCanceled); got != 1 {
		t.Errorf("canceled requests = %v, want 1", got)
	}
	if v := fleetGauge(t, m.Own, "ramjet_model_inflight_requests"); v != 0 {
		t.Errorf("model in flight after the client left = %v", v)
	}
	obsEventually(t, "the reservation released", func() bool { return fleetGauge(t, m.Own, "ramjet_upstream_inflight_requests") == 0 })
}

// seriesNames lists every series name the metric set can emit.
func seriesNames(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.NewSet(func() []fleetstate.Snapshot { return nil }, modelNames)
	return describedNames(m.Collectors()...)
}

// describedNames lists the series names the collectors describe.
func describedNames(cs ...prometheus.Collector) map[string]bool {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	re := regexp.MustCompile(`fqName: "([a-z_:]+)"`)
	names := map[string]bool{}
	for d := range ch {
		if s := re.FindStringSubmatch(d.String()); s != nil {
			names[s[1]] = true
		}
	}
	return names
}

// TestMetricsDocumentedAndCharted: every series is in OBSERVABILITY.md,
// and the Grafana dashboard and the docs name only series that exist.
func TestMetricsDocumentedAndCharted(t *testing.T) {
	names := seriesNames(t)
	if len(names) < 20 {
		t.Fatalf("only %d series described", len(names))
	}
	kv := describedNames(kvCollector())
	for n := range describedNames(engineCollector) { // engines_test.go: documented, not charted
		kv[n] = true
	}
	for n := range describedNames(integCollector()) { // integrity.go, documented as the kv series
		kv[n] = true
	}
	kv["ramjet_slow_reader_cuts_total"] = true // handler.go, documented, not charted
	ref := regexp.MustCompile(`ramjet_[a-z_]+`)
	base := func(n string) string {
		for _, suf := range []string{"_bucket", "_count", "_sum"} {
			if b, ok := strings.CutSuffix(n, suf); ok && (names[b] || kv[b]) {
				return b
			}
		}
		return n
	}
	doc, err := os.ReadFile("OBSERVABILITY.md")
	if err != nil {
		t.Fatal(err)
	}
	for n := range names {
		if !strings.Contains(string(doc), "`"+n+"`") {
			t.Errorf("series %s is not documented in OBSERVABILITY.md", n)
		}
	}
	for _, n := range ref.FindAllString(string(doc), -1) {
		if !names[base(n)] && !kv[base(n)] && !strings.HasPrefix(n, "ramjet_dashboard") && n != "ramjet_body" && n != "ramjet_models" && n != "ramjet_guard" && n != "ramjet_observe" {
			t.Errorf("OBSERVABILITY.md names %s, which no collector emits", n)
		}
	}
	raw, err := os.ReadFile("../deploy/grafana/ramjet.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/ramjet.json: %v", err)
	}
	charted := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range ref.FindAllString(tg.Expr, -1) {
				if !names[base(n)] && !kv[base(n)] {
					t.Errorf("panel %q queries %s, which no collector emits", p.Title, n)
				}
				charted[base(n)] = true
			}
		}
	}
	for n := range names {
		if !charted[n] {
			t.Errorf("series %s has no Grafana panel", n)
		}
	}
}

// TestMetricsObserverFieldsClearedByEnd: End clears a responseObserver,
// which its request state keeps for the next request, field by field (keeping its Response's scanner buffers),
// so a field added to it must be cleared there too: this list is End's.
func TestMetricsObserverFieldsClearedByEnd(t *testing.T) {
	var names []string
	for f := range reflect.TypeFor[responseObserver]().Fields() {
		names = append(names, f.Name)
	}
	want := []string{"Response", "m", "st", "r", "start", "selected", "started", "inflight"}
	if !slices.Equal(names, want) {
		t.Fatalf("responseObserver's fields are %v, End clears %v: clear the new ones in End and update this list", names, want)
	}
}

// TestResponseObserverKept: a request state keeps its response observer
// for its next request once End made it idle, and a second handler on a
// request whose observer is still in use gets one of its own.
func TestResponseObserverKept(t *testing.T) {
	m := metrics.NewSet(func() []fleetstate.Snapshot { return nil }, nil)
	r, st := httptestRequest(t), &reqState{slot: -1}
	o1 := newResponseObserver(r, st, m)
	o2 := newResponseObserver(r, st, m)
	if o1 == o2 {
		t.Fatal("a second handler reused the observer in use")
	}
	o2.End(http.StatusOK, nil)
	o1.End(http.StatusOK, nil)
	if o3 := newResponseObserver(r, st, m); o3 != o2 {
		t.Error("the state's idle observer was not reused")
	}
}

func httptestRequest(t *testing.T) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodGet, "http://127.0.0.1/v1/models", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
