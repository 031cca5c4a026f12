package enginesim

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/enginemetrics"
)

// The simulator's /metrics, read by ramjet's own scraper (package
// enginemetrics): load, KV usage and capacity, and speculative decoding,
// in both dialects.
func TestMetricsScrapedByEnginemetrics(t *testing.T) {
	for _, flavor := range []MetricsFlavor{MetricsVLLM, MetricsSGLang} {
		t.Run(string(flavor), func(t *testing.T) {
			cfg := engine.Config{SpecTokens: 3, CapacityTokens: 65536, BlockSize: 16}
			s := startSim(t, Options{DP: 2, TimeScale: 1, Metrics: flavor, Engine: cfg})
			sc, err := enginemetrics.New(enginemetrics.Config{Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close()
			sc.SetTargets([]enginemetrics.Target{{URL: s.URL() + "/metrics", Replicas: []enginemetrics.ReplicaRef{
				{Key: "r0", Rank: 0}, {Key: "r1", Rank: 1}, {Key: "all", Rank: -1}}}})
			snap := func(key string) enginemetrics.Snapshot {
				sc.ScrapeOnce(context.Background())
				sn, _ := sc.Snapshot(key)
				if sn.Err != "" {
					t.Fatalf("%s: %s", key, sn.Err)
				}
				return sn
			}
			wantEngine := enginemetrics.EngineVLLM
			if flavor == MetricsSGLang {
				wantEngine = enginemetrics.EngineSGLang
			}
			for _, key := range []string{"r0", "r1"} {
				sn := snap(key)
				if sn.Engine != wantEngine || sn.Metrics.KVCapacityTokens != 65536 || sn.Metrics.Running != 0 {
					t.Fatalf("%s idle: %+v", key, sn)
				}
			}
			if sn := snap("all"); sn.Metrics.KVCapacityTokens != 2*65536 {
				t.Fatalf("whole engine capacity %d", sn.Metrics.KVCapacityTokens)
			}

			// A long request on rank 1 shows as running there, with KV in use.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				body := `{"messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 200) + `"}],"max_tokens":30000,"stream":true}`
				req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-data-parallel-rank", "1")
				if res, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
			}()
			defer func() { cancel(); <-done }()
			var r1 enginemetrics.Snapshot
			waitFor(t, "rank 1 running", func() bool { r1 = snap("r1"); return r1.Metrics.Running == 1 })
			if r1.Metrics.KVUsedTokens == 0 || !r1.Metrics.HasKVUsage || r1.Metrics.KVUsage <= 0 {
				t.Fatalf("running request holds no KV: %+v", r1.Metrics)
			}
			if r0 := snap("r0"); r0.Metrics.Running != 0 {
				t.Fatalf("rank 0 running %d", r0.Metrics.Running)
			}
			waitFor(t, "speculative drafts", func() bool {
				m := snap("r1").Metrics.Spec
				return m.Counters && m.Drafts > 10 || m.HasAcceptRate && m.AcceptLength > 1
			})
			sp := snap("r1").Metrics.Spec
			if flavor == MetricsSGLang {
				if sp.Counters || sp.AcceptRate <= 0 || sp.AcceptRate > 1 {
					t.Fatalf("sglang spec gauges %+v", sp)
				}
				return
			}
			if len(sp.AcceptedPerPos) != 3 || sp.DraftTokens != 3*sp.Drafts {
				t.Fatalf("spec counters %+v", sp)
			}
			var sum uint64
			for p, v := range sp.AcceptedPerPos {
				sum += v
				if p > 0 && v > sp.AcceptedPerPos[p-1] {
					t.Fatalf("position %d accepted more than position %d: %v", p, p-1, sp.AcceptedPerPos)
				}
			}
			if sum != sp.AcceptedTokens {
				t.Fatalf("per-position sum %d != accepted %d", sum, sp.AcceptedTokens)
			}
		})
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}
