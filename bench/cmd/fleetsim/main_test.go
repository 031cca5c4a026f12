package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// TestShortSuite runs the command's CI form: every workload and policy at
// a tenth of the requests, with JSON and plots.
func TestShortSuite(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "rows.json")
	var out bytes.Buffer
	if err := run([]string{"-short", "-seeds", "1", "-workload", "all", "-replicas", "8", "-json", jsonPath, "-plots", dir}, &out); err != nil {
		t.Fatal(err)
	}
	for _, name := range workload.Names {
		if !strings.Contains(out.String(), "### "+name+" (") {
			t.Errorf("no table for %s", name)
		}
		if _, err := os.Stat(filepath.Join(dir, "fleetsim-"+name+"-"+replicasOf(name)+".svg")); err != nil {
			t.Errorf("plot: %v", err)
		}
	}
	rows := readJSON[[]fleetsim.SeedSummary](t, jsonPath)
	if want := len(workload.Names) * (len(fleetsim.PolicyNames) + 1); len(rows) != want {
		t.Fatalf("%d JSON rows, want %d", len(rows), want)
	}
}

func replicasOf(name string) string {
	if strings.HasPrefix(name, "spec-pair") {
		return "2"
	}
	return "8"
}

func TestTraceOut(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"burst.jsonl", "burst.csv"} {
		p := filepath.Join(dir, name)
		if err := run([]string{"-workload", "burst", "-write-trace", p}, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := workload.Read(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(tr) != 96 {
			t.Fatalf("%s: %d rows, want 96", name, len(tr))
		}
	}
	if err := run([]string{"-workload", "burst,locality", "-write-trace", filepath.Join(dir, "x")}, &bytes.Buffer{}); err == nil {
		t.Fatal("-write-trace with two workloads accepted")
	}
}

// TestMooncakeTraceReplay writes a small Mooncake-format trace with the
// generator and replays it over three seeds: every policy, both oracles.
func TestMooncakeTraceReplay(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "conv.jsonl")
	if err := run([]string{"-gen-trace", "conversation", "-gen-sessions", "12", "-write-trace", p}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	jsonPath := filepath.Join(dir, "rows.json")
	if err := run([]string{"-trace", p, "-trace-time-scale", "4", "-replicas", "4", "-seeds", "1,2,3",
		"-policy", "ramjet,round-robin,sglang-tuned,llm-d-precise", "-json", jsonPath}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### trace:conv (", "oracle (infinite cache)", "oracle (pooled LRU of the fleet's KV)", "| llm-d-precise |", "ramjet vs best peer (medians)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	rows := readJSON[[]fleetsim.SeedSummary](t, jsonPath)
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 4 policies and the oracle", len(rows))
	}
	for _, r := range rows {
		if r.Seeds != 3 || r.OracleShare.Median <= 0 || r.PooledShare.Median > r.OracleShare.Median+1e-9 {
			t.Fatalf("row %+v: want 3 seeds, a positive oracle and pooled <= infinite", r)
		}
		if r.Policy != fleetsim.Oracle && (r.CachedShare.Max > r.OracleShare.Median+1e-9 || r.Failed.Max > 0) {
			t.Fatalf("row %+v beats the oracle or failed", r)
		}
	}
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 1, oops}\n"), 0o644)
	if err := run([]string{"-trace", bad}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("bad trace: %v, want an error naming line 2", err)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-workload", "nope"},
		{"-policy", "nope", "-workload", "burst"},
		{"-alpha", "-1", "-workload", "burst"},
		{"-engine", "nope", "-workload", "burst"},
		{"-seeds", "1,x", "-workload", "burst"},
	} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestRecords checks -records: one CSV per policy with a row per request,
// whose TTFTs give the row's median.
func TestRecords(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	jsonPath := filepath.Join(dir, "rows.json")
	if err := run([]string{"-workload", "locality", "-scale", "0.1", "-replicas", "4", "-seeds", "1",
		"-policy", "ramjet,dynamo", "-json", jsonPath, "-records", dir}, &out); err != nil {
		t.Fatal(err)
	}
	rows := readJSON[[]fleetsim.SeedSummary](t, jsonPath)
	for _, pol := range []string{"ramjet", "dynamo"} {
		b, err := os.ReadFile(filepath.Join(dir, "records-locality-4-"+pol+".csv"))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if lines[0] != "id,session,turn,replica,sent,ttft,prompt,cached,output,err,done" || len(lines) < 10 {
			t.Fatalf("%s: header %q, %d lines", pol, lines[0], len(lines))
		}
		var ttfts []float64
		for i, l := range lines[1:] {
			f := strings.Split(l, ",")
			if len(f) != 11 || f[0] != strconv.Itoa(i) || f[9] != `""` {
				t.Fatalf("%s line %d: %q", pol, i+1, l)
			}
			v, err := strconv.ParseFloat(f[5], 64)
			if err != nil || v <= 0 {
				t.Fatalf("%s line %d: ttft %q", pol, i+1, f[5])
			}
			sent, err1 := strconv.ParseFloat(f[4], 64)
			done, err2 := strconv.ParseFloat(f[10], 64)
			if err1 != nil || err2 != nil || done < sent+v-1e-3 {
				t.Fatalf("%s line %d: sent %q ttft %q done %q", pol, i+1, f[4], f[5], f[10])
			}
			ttfts = append(ttfts, v)
		}
		sort.Float64s(ttfts)
		var row *fleetsim.SeedSummary
		for i := range rows {
			if rows[i].Policy == pol {
				row = &rows[i]
			}
		}
		if row == nil {
			t.Fatalf("no %s row", pol)
		}
		med := ttfts[len(ttfts)/2]
		if lo, hi := ttfts[(len(ttfts)-1)/2], med; row.TTFTp50.Median < lo-1e-3 || row.TTFTp50.Median > hi+1e-3 {
			t.Errorf("%s: row p50 %.4f, records' median %.4f-%.4f", pol, row.TTFTp50.Median, lo, hi)
		}
	}
}

// TestWriteClosedTrace checks -gen-closed: the generated sessions written
// in this package's JSONL, each later turn chained to an earlier row, the
// same prompts as the Mooncake form row for row.
func TestWriteClosedTrace(t *testing.T) {
	dir := t.TempDir()
	open, closed := filepath.Join(dir, "open.jsonl"), filepath.Join(dir, "closed.jsonl")
	gen := []string{"-gen-trace", "tool-agent", "-gen-sessions", "3", "-gen-rate", "2", "-seed", "5"}
	var out bytes.Buffer
	if err := run(append([]string{"-write-trace", open}, gen...), &out); err != nil {
		t.Fatal(err)
	}
	if err := run(append([]string{"-write-trace", closed, "-gen-closed"}, gen...), &out); err != nil {
		t.Fatal(err)
	}
	wo, err := workload.LoadFile(open, workload.MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wc, err := workload.LoadFile(closed, workload.MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(wc.Trace) != len(wo.Trace) || len(wc.Trace) < 24 {
		t.Fatalf("%d closed rows, %d open", len(wc.Trace), len(wo.Trace))
	}
	chained := 0
	for i, r := range wc.Trace {
		if o := wo.Trace[i]; r.Input != o.Input || len(r.HashIDs) != len(o.HashIDs) || o.After != -1 {
			t.Fatalf("row %d: closed %+v, open %+v", i, r, o)
		}
		if r.After >= 0 {
			chained++
		}
	}
	if chained != len(wc.Trace)-3 {
		t.Fatalf("%d of %d rows chained, want all but the 3 sessions' first turns", chained, len(wc.Trace))
	}
}

// readJSON decodes the JSON file at path (a run's -json rows) into a T.
func readJSON[T any](t *testing.T, path string) T {
	t.Helper()
	var v T
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}
