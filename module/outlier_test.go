package module

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
)

// countedSims starts n simulators, each counting the generation requests
// it receives (every attempt, failed ones included).
func countedSims(t *testing.T, n int, o enginesim.Options) (sims, []*atomic.Int64) {
	t.Helper()
	var ss sims
	counts := make([]*atomic.Int64, n)
	for i := range n {
		c := new(atomic.Int64)
		counts[i] = c
		oi := o
		oi.OnRequest = func(r enginesim.Recorded) {
			if strings.HasSuffix(r.Path, "/completions") {
				c.Add(1)
			}
		}
		ss = append(ss, startSims(t, 1, oi)...)
	}
	return ss, counts
}

// fleetRun sends total chat requests, conc at a time, each with its own
// prompt, and returns how many failed (transport error, non-200 or a
// stream without its end).
func fleetRun(t *testing.T, addr string, total, conc int, stream bool) int {
	t.Helper()
	var failed atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 60 * time.Second}
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if next.Add(1) > int64(total) {
					return
				}
				i := promptSeq.Add(1) // a prompt of its own, across calls
				body := fmt.Sprintf(`{"model":"qwen3-8b","max_tokens":8,"stream":%v,"messages":[{"role":"user","content":"request %d: tell me about outliers number %d"}]}`, stream, i, i*7919)
				resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					failed.Add(1)
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || (stream && !strings.Contains(string(b), "[DONE]")) {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return int(failed.Load())
}

// promptSeq numbers the prompts of fleetRun, so that no two requests of a
// test share one (affinity would pin them to one replica).
var promptSeq atomic.Int64

func share(counts []*atomic.Int64, i int) (int64, int64) {
	var sum int64
	for _, c := range counts {
		sum += c.Load()
	}
	return counts[i].Load(), sum
}

func perEngine(counts []*atomic.Int64) []int64 {
	out := make([]int64, len(counts))
	for i, c := range counts {
		out[i] = c.Load()
	}
	return out
}

// directiveCaddyfile is the shipped ramjet directive over dials.
func directiveCaddyfile(dials []string, extra string) string {
	return `{
	admin {ADMIN}
	auto_https off
	log {
		level ERROR
	}
}

http://{ADDR} {
	ramjet ` + strings.Join(dials, " ") + ` {
		health_interval 200ms
` + extra + `
	}
}
`
}

// TestOutlierFailFastEngine: one engine of four answers 500 to everything.
// Before (outlier detection off, retries on transport errors only, as
// before this change) it draws most of the traffic; with the shipped
// directive it gets its ejection probes' worth (under 5%) and, 5xx answers
// being retried on other replicas, no client request fails.
func TestOutlierFailFastEngine(t *testing.T) {
	const total, conc = 400, 8
	t.Run("before", func(t *testing.T) {
		ss, counts := countedSims(t, 4, enginesim.Options{})
		if err := ss[0].SetFaults(enginesim.Faults{ErrorRate: 1}); err != nil {
			t.Fatal(err)
		}
		c := startCaddyfile(t, `{
	admin {ADMIN}
	auto_https off
	log {
		level ERROR
	}
}

http://{ADDR} {
	ramjet_observe
	reverse_proxy `+strings.Join(ss.dials(), " ")+` {
		lb_policy ramjet {
			state_key before
			outlier {
				consecutive_failures off
			}
		}
		lb_retries 2
		lb_retry_match path *
		flush_interval -1
	}
}
`)
		failed := fleetRun(t, c.client, total, conc, false)
		bad, sum := share(counts, 0)
		t.Logf("before: requests per engine %v (bad engine %d of %d attempts), client errors %d/%d", perEngine(counts), bad, sum, failed, total)
		// The defect this change fixes: failing fast, the engine's load
		// stays near zero and it wins most requests.
		if bad*4 <= sum*3/2 {
			t.Errorf("without outlier detection the failing engine drew %d of %d attempts, want well over its fair share (the baseline changed)", bad, sum)
		}
	})
	t.Run("after", func(t *testing.T) {
		ss, counts := countedSims(t, 4, enginesim.Options{})
		if err := ss[0].SetFaults(enginesim.Faults{ErrorRate: 1}); err != nil {
			t.Fatal(err)
		}
		c := startCaddyfile(t, directiveCaddyfile(ss.dials(), ""))
		failed := fleetRun(t, c.client, total, conc, false)
		bad, sum := share(counts, 0)
		t.Logf("after: requests per engine %v (bad engine %d of %d attempts), client errors %d/%d", perEngine(counts), bad, sum, failed, total)
		if bad*100 >= total*5 {
			t.Errorf("failing engine got %d attempts, want under 5%% of %d requests", bad, total)
		}
		if failed*100 >= total {
			t.Errorf("%d of %d client requests failed, want under 1%%", failed, total)
		}
		// /health names the ejected replica.
		resp, err := http.Get("http://" + c.client + "/health")
		if err != nil {
			t.Fatal(err)
		}
		var rep fleetstate.HealthReport
		err = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		id := lookupFleet("").RouteID(ss[0].Addr())
		ok := false
		for _, r := range rep.Replicas {
			if r.ID == id && !r.Healthy && r.Reason == "ejected" {
				ok = true
			}
		}
		if rep.Status != fleetstate.StatusDegraded || !ok {
			t.Errorf("/health = %+v, want degraded with replica %s ejected", rep, id)
		}
		// The metrics say so too.
		reg := prometheus.NewRegistry()
		reg.MustRegister(metrics.NewFleetCollector(snapshotFleets))
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var gauge, ejections float64
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				up := ""
				reason := ""
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "upstream":
						up = l.GetValue()
					case "reason":
						reason = l.GetValue()
					}
				}
				if up != id {
					continue
				}
				switch mf.GetName() {
				case "ramjet_upstream_ejected":
					gauge = m.GetGauge().GetValue()
				case "ramjet_ejections_total":
					if reason == "status" {
						ejections = m.GetCounter().GetValue()
					}
				}
			}
		}
		if gauge != 1 || ejections < 1 {
			t.Errorf("ramjet_upstream_ejected = %v, ramjet_ejections_total{reason=status} = %v; want 1 and >= 1", gauge, ejections)
		}
	})
}

// TestOutlierCutStreamEngine: one engine of four cuts every stream after
// 3 tokens. It is ejected after its first cuts; the streams it cut (bytes
// had reached the client, so they are not retried) are bounded by the
// ejection threshold plus the requests in flight at that moment.
func TestOutlierCutStreamEngine(t *testing.T) {
	const total, conc = 400, 8
	ss, counts := countedSims(t, 4, enginesim.Options{})
	if err := ss[0].SetFaults(enginesim.Faults{DieAfterTokens: 3}); err != nil {
		t.Fatal(err)
	}
	c := startCaddyfile(t, directiveCaddyfile(ss.dials(), ""))
	failed := fleetRun(t, c.client, total, conc, true)
	bad, sum := share(counts, 0)
	t.Logf("cut streams: requests per engine %v (bad engine %d of %d), client errors %d/%d", perEngine(counts), bad, sum, failed, total)
	if bad*100 >= total*5 {
		t.Errorf("cutting engine got %d attempts, want under 5%% of %d requests", bad, total)
	}
	if failed > selection.DefaultConsecutiveCuts+conc+2 {
		t.Errorf("%d streams failed, want at most the cut ejection threshold plus those in flight (%d)", failed, selection.DefaultConsecutiveCuts+conc+2)
	}
	f := lookupFleet("")
	s, _ := f.Base().Lookup(ss[0].Addr())
	if f.Detector().Ejections(s, selection.FailCut) < 1 {
		t.Error("no ejection for cut streams")
	}
}

// TestRetriesMove: with outlier detection off, one engine of two answers
// 500 to everything; the directive's retry setting (a 5xx is retried) and
// the policy (a retry goes to a replica not tried) make every request
// succeed on the other engine.
func TestRetriesMove(t *testing.T) {
	ss, counts := countedSims(t, 2, enginesim.Options{})
	if err := ss[0].SetFaults(enginesim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	c := startCaddyfile(t, `{
	admin {ADMIN}
	auto_https off
	log {
		level ERROR
	}
}

http://{ADDR} {
	ramjet_observe
	reverse_proxy `+strings.Join(ss.dials(), " ")+` {
		lb_policy ramjet {
			state_key moves
			outlier {
				consecutive_failures off
			}
		}
		lb_retries 1
		lb_retry_match path *
		lb_retry_match `+"`{http.reverse_proxy.status_code} >= 500`"+`
		flush_interval -1
	}
}
`)
	const total = 60
	if failed := fleetRun(t, c.client, total, 2, false); failed != 0 {
		t.Errorf("%d of %d requests failed; per engine %v", failed, total, perEngine(counts))
	}
	if counts[0].Load() == 0 || counts[1].Load() != total {
		t.Errorf("per engine %v: want some attempts on the failing engine, every request answered by the other", perEngine(counts))
	}
}

// TestOutlierHalfOpen: an ejected replica gets no traffic while ejected,
// one probe after its ejection time, and is re-admitted when the probe
// succeeds.
func TestOutlierHalfOpen(t *testing.T) {
	ss, counts := countedSims(t, 2, enginesim.Options{})
	c := startCaddy(t, ss.dials(), proxyOpts{Policy: map[string]any{"outlier": map[string]any{
		"consecutive_failures": 2, "base_ejection": "3s", "max_ejection": "10s"}}})
	f := lookupFleet("")
	// Short prompts have no full block: every one is placed by the same
	// rendezvous order, which depends on the engines' random ports. Fail
	// the engine that order picks, so that it sees the traffic.
	fleetRun(t, c.client, 1, 1, false)
	bad := 0
	if counts[1].Load() > counts[0].Load() {
		bad = 1
	}
	if err := ss[bad].SetFaults(enginesim.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	var slot selection.Slot = -1
	// Wait for the ejection by its count, not its state: on a slow machine
	// a 3s ejection may already be over (half-open) when the loop looks.
	eventually(t, "the failing replica ejected", func() bool {
		fleetRun(t, c.client, 2, 1, false)
		s, ok := f.Base().Lookup(ss[bad].Addr())
		slot = s
		return ok && f.Detector().Ejections(s, selection.FailStatus) > 0
	})
	if !f.Detector().Ejected(slot) || f.Detector().Usable(slot) {
		// The machine was so slow that the ejection already ran out.
		t.Skip("ejection expired before the check")
	}
	before := counts[bad].Load()
	fleetRun(t, c.client, 10, 1, false)
	if f.Detector().Usable(slot) {
		t.Skip("ejection expired during the check")
	}
	if got := counts[bad].Load() - before; got != 0 {
		t.Fatalf("ejected replica got %d requests", got)
	}
	if err := ss[bad].SetFaults(enginesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ejection time over", func() bool { return f.Detector().Usable(slot) })
	eventually(t, "the probe re-admits the replica", func() bool {
		fleetRun(t, c.client, 4, 1, false)
		return !f.Detector().Ejected(slot)
	})
	if counts[bad].Load() == before {
		t.Fatal("no probe reached the replica")
	}
}

// TestOutlierEjectedShareCap: with three of four engines failing, at most
// half of the fleet (the default max_ejected_percent) is ejected.
func TestOutlierEjectedShareCap(t *testing.T) {
	ss, _ := countedSims(t, 4, enginesim.Options{})
	c := startCaddy(t, ss.dials(), proxyOpts{Policy: map[string]any{"outlier": map[string]any{
		"consecutive_failures": 2, "base_ejection": "1m"}}})
	for _, s := range ss[:3] {
		if err := s.SetFaults(enginesim.Faults{ErrorRate: 1}); err != nil {
			t.Fatal(err)
		}
	}
	f := lookupFleet("")
	eventually(t, "two replicas ejected", func() bool {
		fleetRun(t, c.client, 8, 2, false)
		return f.Detector().EjectedCount() == 2
	})
	fleetRun(t, c.client, 40, 4, false)
	if n := f.Detector().EjectedCount(); n != 2 {
		t.Fatalf("%d replicas ejected, want the cap of 2", n)
	}
}

// TestStreamCutSSEError: an engine dying mid-stream gives the official
// OpenAI Go SDK a stream error, not a silent end.
func TestStreamCutSSEError(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{})
	if err := ss[0].SetFaults(enginesim.Faults{DieAfterTokens: 3}); err != nil {
		t.Fatal(err)
	}
	c := startCaddyfile(t, directiveCaddyfile(ss.dials(), ""))
	client := openai.NewClient(option.WithBaseURL("http://"+c.client+"/v1"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:     "qwen3-8b",
		MaxTokens: openai.Int(32),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("count to ten")},
	})
	chunks := 0
	for stream.Next() {
		chunks++
	}
	err := stream.Err()
	var se *ssestream.StreamError
	if !errors.As(err, &se) || !strings.Contains(se.Message, "upstream_error") {
		t.Fatalf("after %d chunks: stream error %v (%T), want the SSE error event", chunks, err, err)
	}
	if chunks == 0 {
		t.Fatal("no chunk before the cut")
	}
}

func TestOutlierCaddyfile(t *testing.T) {
	tests := []struct {
		src  string
		want selection.OutlierSettings
		err  string
	}{
		{src: "ramjet {\n outlier {\n consecutive_failures 3\n base_ejection 2s\n max_ejection 1m\n max_ejected_percent 25\n }\n}",
			want: selection.OutlierSettings{ConsecutiveFailures: 3, BaseEjection: duration.Duration(2 * time.Second), MaxEjection: duration.Duration(time.Minute), MaxEjectedPercent: 25}},
		{src: "ramjet {\n outlier {\n consecutive_failures off\n }\n}", want: selection.OutlierSettings{ConsecutiveFailures: -1}},
		{src: "ramjet {\n outlier {\n consecutive_cuts 1\n }\n}", want: selection.OutlierSettings{ConsecutiveCuts: 1}},
		{src: "ramjet {\n outlier {\n consecutive_cuts 0\n }\n}", err: "positive integer"},
		{src: "ramjet {\n outlier {\n consecutive_failures 0\n }\n}", err: "positive integer"},
		{src: "ramjet {\n outlier {\n base_ejection soon\n }\n}", err: "positive duration"},
		{src: "ramjet {\n outlier {\n ejections 3\n }\n}", err: "outlier: unrecognized option 'ejections'"},
		{src: "ramjet {\n outlier {\n base_ejection 1s\n base_ejection 2s\n }\n}", err: "more than once"},
	}
	for _, tc := range tests {
		var s RamjetSelection
		err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.src))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.src, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.src, err)
			continue
		}
		if s.Outlier == nil || *s.Outlier != tc.want {
			t.Errorf("%q: got %+v, want %+v", tc.src, s.Outlier, tc.want)
		}
	}
	bad := RamjetSelection{PolicySettings: fleetstate.PolicySettings{Outlier: &selection.OutlierSettings{BaseEjection: duration.Duration(time.Minute), MaxEjection: duration.Duration(time.Second)}}}
	bad.Config.SetDefaults()
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "max_ejection") {
		t.Errorf("Validate: %v, want max_ejection named", err)
	}
}
