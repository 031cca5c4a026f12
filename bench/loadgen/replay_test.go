package loadgen_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// testPolicy is the selection policy the replay test runs through.
const testPolicy = "ramjet"

// startFleet starts n engine simulators running timeScale times faster
// than real time and a Caddy in front of them with policy.
func startFleet(t *testing.T, n int, timeScale float64, policy string) (*caddyrun.Running, []*enginesim.Server) {
	t.Helper()
	var sims []*enginesim.Server
	var addrs []string
	for i := range n {
		s, err := enginesim.Start(context.Background(), enginesim.Options{Model: "sim", TimeScale: timeScale, Seed: uint64(i) + 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sims = append(sims, s)
		addrs = append(addrs, s.Addr())
	}
	site := caddyrun.RamjetSite("lb", policy, addrs)
	run, err := caddyrun.Start([]caddyrun.Site{site})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddyrun.Stop() })
	return run, sims
}

// TestReplayThroughCaddy replays the locality workload through Caddy with
// ramjet in front of 4 engine simulators and checks that every request is
// accounted for, every response named its replica, the prompts had the
// trace's density and the shared prefixes were served from cache.
func TestReplayThroughCaddy(t *testing.T) {
	run, _ := startFleet(t, 4, 20, testPolicy)
	w, err := workload.Generate("locality", workload.Options{Seed: 3, Replicas: 4, Scale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	for _, upHeader := range []string{loadgen.DefaultUpstreamHeader, caddyrun.SpreadHeader} {
		t.Run(upHeader, func(t *testing.T) {
			if upHeader == loadgen.DefaultUpstreamHeader && testPolicy != "ramjet" {
				t.Skip("X-Ramjet-Upstream is set by ramjet only")
			}
			client, err := loadgen.NewClient(loadgen.ClientConfig{
				BaseURL: run.URL("lb"), Model: "sim", Timeout: 30 * time.Second,
				UpstreamHeader: upHeader, IgnoreEOS: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			var mu sync.Mutex
			seen := make(map[int]bool)
			rep, err := loadgen.Run(context.Background(), loadgen.RunConfig{
				Trace: w.Trace, Client: client, TimeScale: 20,
				Synth:       loadgen.Synthesizer{Synth: workload.Synth{Salt: uint64(len(upHeader))}, History: loadgen.HistoryActual},
				MaxDuration: 40 * time.Second,
				Results: func(r *loadgen.Result) {
					mu.Lock()
					defer mu.Unlock()
					if seen[r.Index] {
						t.Errorf("request %d reported twice", r.Index)
					}
					seen[r.Index] = true
					if r.OK() && r.Upstream == "" {
						t.Errorf("request %d: no %s header", r.Index, upHeader)
					}
					if r.OK() && r.OutputTokens < r.WantOutput {
						t.Errorf("request %d: %d output tokens, want %d", r.Index, r.OutputTokens, r.WantOutput)
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			n := len(w.Trace)
			if rep.Requests != n || rep.Sent != n || rep.Completed != n || rep.Failed != 0 || rep.NotSent != 0 || len(seen) != n {
				var sb strings.Builder
				rep.WriteTable(&sb)
				t.Fatalf("want all %d requests completed, got:\n%s", n, sb.String())
			}
			if err := (loadgen.Gate{MaxMedianDrift: 0.02, MaxP95Drift: 0.05}).Check(rep.Density); err != nil {
				t.Fatal(err)
			}
			// 3 apps with 8k-token system prompts on 4 replicas: later
			// requests of an app find its prompt cached.
			if rep.CachedShare < 0.2 {
				t.Fatalf("cached share %.2f, want >= 0.2", rep.CachedShare)
			}
			total := 0
			for _, c := range rep.Upstreams {
				total += c
			}
			if total != n || len(rep.Upstreams) > 4 {
				t.Fatalf("upstreams %v: want %d requests over at most 4 replicas", rep.Upstreams, n)
			}
			if rep.TTFT.Count != n || rep.TTFT.P50 <= 0 || rep.ITL.Count == 0 || rep.E2E.P50 < rep.TTFT.P50 {
				t.Fatalf("timings: ttft %+v itl %+v e2e %+v", rep.TTFT, rep.ITL, rep.E2E)
			}
		})
	}
}

// TestReplayErrorsAndCancel checks that failures are counted by kind and
// that canceling a run returns promptly with every request accounted for.
func TestReplayErrorsAndCancel(t *testing.T) {
	_, sims := startFleet(t, 1, 20, "round_robin")
	w, err := workload.Generate("burst", workload.Options{Seed: 1, Scale: 0.125})
	if err != nil {
		t.Fatal(err)
	}
	newClient := func(url string, timeout time.Duration) *loadgen.Client {
		c, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: url, Model: "sim", Timeout: timeout, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	synth := loadgen.Synthesizer{Synth: workload.Synth{Salt: 5}}
	tests := []struct {
		name   string
		faults enginesim.Faults
		url    string
		want   loadgen.ErrorKind
	}{
		{name: "server errors", faults: enginesim.Faults{ErrorRate: 1, ErrorStatus: 503}, want: loadgen.ErrHTTP5xx},
		{name: "bad request", faults: enginesim.Faults{ErrorRate: 1, ErrorStatus: 400}, want: loadgen.ErrHTTP4xx},
		{name: "mid-stream drop", faults: enginesim.Faults{DieAfterTokens: 3}, want: loadgen.ErrStream},
		{name: "hang hits the timeout", faults: enginesim.Faults{HangBeforeFirstToken: true}, want: loadgen.ErrTimeout},
		{name: "connection refused", url: "http://127.0.0.1:1/v1", want: loadgen.ErrConnect},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := sims[0].SetFaults(tt.faults); err != nil {
				t.Fatal(err)
			}
			defer sims[0].SetFaults(enginesim.Faults{})
			url := tt.url
			if url == "" {
				url = sims[0].URL() + "/v1"
			}
			start := time.Now()
			rep, err := loadgen.Run(context.Background(), loadgen.RunConfig{
				Trace: w.Trace, Client: newClient(url, 2*time.Second), Synth: synth, TimeScale: 20,
			})
			if err != nil {
				t.Fatal(err)
			}
			if el := time.Since(start); el > 15*time.Second {
				t.Fatalf("run took %v", el)
			}
			n := len(w.Trace)
			if rep.Failed != n || rep.Errors[tt.want] != n {
				t.Fatalf("want %d %s errors, got failed=%d errors=%v samples=%v", n, tt.want, rep.Failed, rep.Errors, rep.ErrorSamples)
			}
		})
	}
	t.Run("cancel", func(t *testing.T) {
		if err := sims[0].SetFaults(enginesim.Faults{HangBeforeFirstToken: true}); err != nil {
			t.Fatal(err)
		}
		defer sims[0].SetFaults(enginesim.Faults{})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		// Half the trace at once, the rest a minute later: the cancel
		// finds requests in flight and requests not yet sent.
		tr := append(workload.Trace(nil), w.Trace...)
		for i := len(tr) / 2; i < len(tr); i++ {
			tr[i].At = 60
		}
		start := time.Now()
		rep, err := loadgen.Run(ctx, loadgen.RunConfig{Trace: tr, Client: newClient(sims[0].URL()+"/v1", time.Minute), Synth: synth})
		if err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("cancel took %v", el)
		}
		n := len(tr)
		if rep.Sent != n/2 || rep.NotSent != n-n/2 || rep.Errors[loadgen.ErrCanceled] != n/2 || rep.Interrupted != "canceled" {
			t.Fatalf("sent %d not sent %d errors %v interrupted %q", rep.Sent, rep.NotSent, rep.Errors, rep.Interrupted)
		}
	})
}

// TestTokenizeCalibration runs the /tokenize preflight against the engine
// simulator, whose ChatML template adds 5 tokens per message (6 for an
// assistant message) and 4 for the generation prompt.
func TestTokenizeCalibration(t *testing.T) {
	_, sims := startFleet(t, 1, 20, "round_robin")
	w, err := workload.Generate("locality", workload.Options{Seed: 3, Scale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	o, err := loadgen.Calibrate(context.Background(), &http.Client{Timeout: 10 * time.Second}, sims[0].URL(), "sim",
		loadgen.Synthesizer{Synth: workload.Synth{Salt: 1}}, w.Trace)
	if err != nil {
		t.Fatal(err)
	}
	// Turn 0: system, user -> 5+5+4 = 14. Turn 1: + assistant, user -> 25.
	// The fit through (2, 14) and (4, 25) is 3 + 5.5 per message.
	if got := fmt.Sprintf("%.2f %.2f %v", o.Fixed, o.PerMessage, o.Calibrated); got != "3.00 5.50 true" {
		t.Fatalf("overhead %s, want 3.00 5.50 true", got)
	}
	if _, err := loadgen.Calibrate(context.Background(), http.DefaultClient, "http://127.0.0.1:1", "sim",
		loadgen.Synthesizer{}, w.Trace); err == nil {
		t.Fatal("calibration against a closed port succeeded")
	}
}
