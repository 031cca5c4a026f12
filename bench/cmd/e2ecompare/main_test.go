package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// TestE2ECompareSmoke replays one round of the burst workload and a window
// of a Mooncake-format trace through ramjet and round_robin and checks
// every row is complete.
func TestE2ECompareSmoke(t *testing.T) {
	rowsM, err := workload.GenerateMooncake("tool-agent", workload.MooncakeGenOptions{Seed: 1, Sessions: 2, Rate: 2})
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
