package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

func startSim(t *testing.T) *enginesim.Server {
	t.Helper()
	s, err := enginesim.Start(context.Background(), enginesim.Options{Model: "sim", TimeScale: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestGateExitPath replays a trace of tiny prompts (8 tokens in 2 or 4
// messages): the simulator's chat template adds 14 to 25 tokens to each,
// so the server counts two to four times what the trace asked for and the
// default density gate fails the run with a clear message. The /tokenize
// preflight measures the template's overhead and the same run then passes.
func TestGateExitPath(t *testing.T) {
	s := startSim(t)
	trace := filepath.Join(t.TempDir(), "tiny.csv")
	csv := "id,at,after,think,session,turn,group,prefix,input,output\n"
	for sess := range 6 {
		csv += fmt.Sprintf("%d,0,-1,0,%d,0,0,4,8,4\n", 2*sess, sess)
		csv += fmt.Sprintf("%d,0,%d,0,%d,1,0,4,16,4\n", 2*sess+1, 2*sess, sess)
	}
	if err := os.WriteFile(trace, []byte(csv), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-url", s.URL() + "/v1", "-model", "sim", "-trace", trace}

	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "density gate: median prompt-token drift") {
		t.Fatalf("want a density gate failure, got %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "12 completed") {
		t.Fatalf("the report was not printed before the gate failed:\n%s", out.String())
	}

	out.Reset()
	errOut.Reset()
	if err := run(context.Background(), append(args, "-tokenize", "-json", "-salt", "2"), &out, &errOut); err != nil {
		t.Fatalf("with -tokenize: %v\n%s", err, errOut.String())
	}
	var rep loadgen.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("-json output: %v\n%s", err, out.String())
	}
	// What remains is one token per earlier turn: the simulator counts
	// <|im_end|> in completion_tokens, and the reply text sent back is one
	// token shorter (the template adds <|im_end|> again): 40 of 41 tokens.
	if rep.Completed != 12 || !rep.Density.Overhead.Calibrated || math.Abs(rep.Density.MedianDrift) > 0.03 {
		t.Fatalf("report: completed %d density %+v", rep.Completed, rep.Density)
	}
	if !strings.Contains(errOut.String(), "chat-template overhead") {
		t.Fatalf("stderr: %s", errOut.String())
	}
}

func TestClosedLoopAndOut(t *testing.T) {
	s := startSim(t)
	out := filepath.Join(t.TempDir(), "results.jsonl")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-url", s.URL() + "/v1", "-model", "sim", "-workload", "burst", "-scale", "0.125",
		"-mode", "closed", "-concurrency", "3", "-history", "synthetic", "-out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 12 {
		t.Fatalf("%d result lines, want 12", len(lines))
	}
	var r loadgen.Result
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil || r.PromptTokens == 0 {
		t.Fatalf("first result %+v: %v", r, err)
	}
	if !strings.Contains(stdout.String(), "12 completed") {
		t.Fatalf("report:\n%s", stdout.String())
	}
}

func TestErrorRateExitPath(t *testing.T) {
	s := startSim(t)
	if err := s.SetFaults(enginesim.Faults{ErrorRate: 1, ErrorStatus: 500}); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-url", s.URL() + "/v1", "-model", "sim", "-workload", "burst", "-scale", "0.125"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "12 of 12 requests failed") {
		t.Fatalf("want an error-rate failure, got %v", err)
	}
	if !strings.Contains(stdout.String(), "http_5xx=12") {
		t.Fatalf("report:\n%s", stdout.String())
	}
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{}, "give -trace FILE or -workload NAME"},
		{[]string{"-workload", "burst", "-trace", "x"}, "not both"},
		{[]string{"-workload", "nope"}, "unknown workload"},
		{[]string{"-workload", "burst", "-mode", "sideways"}, "want open or closed"},
		{[]string{"-workload", "burst", "-history", "maybe"}, "want actual or synthetic"},
		{[]string{"-workload", "burst", "-progress", "loud"}, "want auto, on or off"},
	}
	for _, tt := range tests {
		err := run(context.Background(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%v: want error containing %q, got %v", tt.args, tt.wantErr, err)
		}
	}
}

// TestMooncakeReplay replays a window of a generated Mooncake-format trace
// over HTTP: every request completes, and rows sharing hash ids hit the
// engine's prefix cache.
func TestMooncakeReplay(t *testing.T) {
	s := startSim(t)
	rows, err := workload.GenerateMooncake("conversation", workload.MooncakeGenOptions{Seed: 2, Sessions: 8, Rate: 4})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "conv.jsonl")
	var buf bytes.Buffer
	if err := workload.WriteMooncake(&buf, rows); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"-url", s.URL() + "/v1", "-model", "sim", "-trace", path,
		"-trace-duration", "60000", "-trace-rows", "16", "-time-scale", "50", "-json"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rep loadgen.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Requests == 0 || rep.Requests > 16 || rep.Completed != rep.Requests || rep.CachedShare <= 0 {
		t.Fatalf("report: %d requests, %d completed, cached share %.3f", rep.Requests, rep.Completed, rep.CachedShare)
	}
}
