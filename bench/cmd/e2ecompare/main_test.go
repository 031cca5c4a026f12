package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// agentTrace writes a small generated tool-agent trace (two sessions, seed
// seed) to a temp file and returns its path.
func agentTrace(t *testing.T, seed uint64) string {
	t.Helper()
	rowsM, err := workload.GenerateMooncake("tool-agent", workload.MooncakeGenOptions{Seed: seed, Sessions: 2, Rate: 2})
	if err != nil {
		t.Fatal(err)
	}
	var tb bytes.Buffer
	if err := workload.WriteMooncake(&tb, rowsM); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(t.TempDir(), "agents.jsonl")
	if err := os.WriteFile(trace, tb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return trace
}

// TestE2ECompareSmoke replays one round of the burst workload and a window
// of a Mooncake-format trace through ramjet and round_robin and checks
// every row is complete.
func TestE2ECompareSmoke(t *testing.T) {
	trace := agentTrace(t, 1)
	var err error
	var out, errOut bytes.Buffer
	err = run(context.Background(), []string{"-workload", "burst", "-scale", "0.125", "-trace", trace, "-trace-rows", "8",
		"-policy", "ramjet,round_robin", "-replicas", "4", "-time-scale", "20", "-json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 4 || rows[0].Policy != "ramjet" || rows[1].Policy != "round_robin" || rows[2].Workload != "trace:agents" {
		t.Fatalf("rows: %+v", rows)
	}
	for i, r := range rows {
		want := 12
		if i >= 2 {
			want = 8
		}
		if r.OK != want || r.Requests != want || r.Failed != 0 || r.ReplicasUsed == 0 || r.MaxMeanLoad < 1 || r.TTFTp50 <= 0 {
			t.Errorf("%s/%s: %+v", r.Workload, r.Policy, r)
		}
	}
	if rows[2].Cached <= 0 {
		t.Errorf("trace replay through ramjet cached nothing: %+v", rows[2])
	}
	if md := markdown(rows); !strings.Contains(md, "| burst | ramjet | 12/12 |") {
		t.Errorf("markdown:\n%s", md)
	}
}

// TestMarkdownSendLag checks the table's last column is the load
// generator's p90 send lag (a starved run's sign), and a row without a
// report prints 0 there.
func TestMarkdownSendLag(t *testing.T) {
	starved := &loadgen.Report{QueueDelay: loadgen.Dist{P50: 90, P90: 845}}
	md := markdown([]Row{{Workload: "w", Policy: "p", Report: starved}, {Workload: "w", Policy: "q"}})
	for _, want := range []string{"| wall s | send lag p90 ms |", "| 845 |\n", "| q | 0/0 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Count(md, "| 0 |\n") != 1 {
		t.Errorf("the row without a report should end in 0:\n%s", md)
	}
}

// TestSiteForKnowsTheEnginesCapacity checks that ramjet and ramjet-precise
// are told the engines' KV capacity (kv_capacity), as the fleet
// simulation's rows of those names are, that ramjet-nocap is not, that
// all three take the instance_id asked for (SoloInstance: spill position
// 0, as the simulation's lone instance), and that the real Caddy accepts
// each site and routes a request through it.
func TestSiteForKnowsTheEnginesCapacity(t *testing.T) {
	if p := selection.InstancePosition(SoloInstance); p != 0 {
		t.Fatalf("InstancePosition(%q) = %d: the single-instance rows would spill", SoloInstance, p)
	}
	sims, addrs := startCapacityEngines(t)
	tests := []struct {
		pol  string
		want any
	}{{"ramjet", 65536}, {"ramjet-precise", 65536}, {"ramjet-nocap", nil}}
	for _, tt := range tests {
		t.Run(tt.pol, func(t *testing.T) {
			if id, ok := siteFor(tt.pol, addrs, sims, 0, "").PolicyConfig["instance_id"]; ok {
				t.Errorf("instance_id %v without -instance-id: want the module's default", id)
			}
			site := siteFor(tt.pol, addrs, sims, 0, SoloInstance)
			if got := site.PolicyConfig["kv_capacity"]; got != tt.want {
				t.Errorf("kv_capacity = %v, want %v", got, tt.want)
			}
			if got := site.PolicyConfig["instance_id"]; got != SoloInstance {
				t.Errorf("instance_id = %v, want %s", got, SoloInstance)
			}
			if _, kv := site.PolicyConfig["kv"]; kv != (tt.pol == "ramjet-precise") || site.Policy != "ramjet" {
				t.Errorf("site %+v", site)
			}
			running, err := caddyrun.Start([]caddyrun.Site{site})
			if err != nil {
				t.Fatal(err)
			}
			defer caddyrun.Stop()
			client, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: running.URL("lb"), Model: engineModel, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			if res := client.Do(context.Background(), []loadgen.Message{{Role: "user", Content: "hello"}}, 4, false); !res.OK() {
				t.Errorf("request through %s: %+v", tt.pol, res)
			}
		})
	}
}

// startCapacityEngines starts two simulated engines of 65,536 tokens of
// KV publishing KV events, for a small burst workload, and their
// addresses; they close when the test ends.
func startCapacityEngines(t *testing.T) ([]*enginesim.Server, []string) {
	t.Helper()
	w, err := workload.Generate("burst", workload.Options{Seed: 1, Replicas: 2, Scale: 0.125})
	if err != nil {
		t.Fatal(err)
	}
	sims, addrs, err := startEngines(context.Background(), w, 2, 65536, 20, engine.Tokenizer{}, true)
	t.Cleanup(func() { closeEngines(sims) })
	if err != nil {
		t.Fatal(err)
	}
	return sims, addrs
}

// TestE2ECompareDensity replays a window of a Mooncake-format trace at
// -density 2.5 and 4 through ramjet-precise: the engines count the trace's
// tokens at either density (prompt drift within the chat template's few
// tokens; rendered at 4 bytes per token for engines at 2.5 it would be
// +60%), and the prompt tokens of the two runs differ only by the
// template's fixed parts cut at 2.5.
func TestE2ECompareDensity(t *testing.T) {
	trace := agentTrace(t, 2)
	rows := map[string]Row{}
	for _, d := range []string{"2.5", "4"} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"-trace", trace, "-trace-rows", "8", "-density", d,
			"-policy", "ramjet-precise", "-replicas", "2", "-time-scale", "20", "-json"}, &out, &errOut)
		if err != nil {
			t.Fatalf("%v\n%s", err, errOut.String())
		}
		var rs []Row
		if err := json.Unmarshal(out.Bytes(), &rs); err != nil || len(rs) != 1 {
			t.Fatalf("%v\n%s", err, out.String())
		}
		r := rs[0]
		if r.OK != 8 || r.Failed != 0 || r.Report == nil || r.Report.Density.Samples != 8 {
			t.Fatalf("density %s: %+v", d, r)
		}
		if r.DensityDrift < 0 || r.DensityDrift > 0.03 {
			t.Errorf("density %s: median prompt drift %+.3f, want the template's few tokens", d, r.DensityDrift)
		}
		rows[d] = r
	}
	a, b := rows["2.5"].Report.PromptTokens, rows["4"].Report.PromptTokens
	if a < b || a > b+8*8 {
		t.Errorf("prompt tokens %d at 2.5, %d at 4: want the same rows' tokens and at most 8 more per request", a, b)
	}
	var errOut bytes.Buffer
	if err := run(context.Background(), []string{"-density", "0.5", "-policy", "ramjet"}, io.Discard, &errOut); err == nil || !strings.Contains(err.Error(), "-density") {
		t.Errorf("-density 0.5: %v", err)
	}
	if err := run(context.Background(), []string{"-density", "3", "-policy", "dynamo"}, io.Discard, &errOut); err == nil || !strings.Contains(err.Error(), "peers") {
		t.Errorf("-density 3 with a peer: %v", err)
	}
}

// TestRowKVSeries checks that a single-instance row and a -routers row
// carry the in-process Caddy's routing series: decisions by mode and the
// tokenize preflights for ramjet-precise, other instances seen for both.
func TestRowKVSeries(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-workload", "burst", "-scale", "0.125", "-policy", "ramjet-precise",
		"-routers", "2", "-routers-policy", "ramjet-precise", "-replicas", "2", "-time-scale", "20", "-json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, r := range rows {
		for _, want := range []string{"kv_decisions_total{mode=precise}=", "tokenize_requests_total", "other_instances_seen=", "prompt_bytes_per_token="} {
			if !strings.Contains(r.KV, want) {
				t.Errorf("%s: KV %q lacks %q", r.Policy, r.KV, want)
			}
		}
	}
}
