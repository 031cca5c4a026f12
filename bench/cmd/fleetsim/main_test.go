package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
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
	if err := run([]string{"-short", "-workload", "all", "-replicas", "8", "-json", jsonPath, "-plots", dir}, &out); err != nil {
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
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rows []fleetsim.Summary
	if err := json.Unmarshal(b, &rows); err != nil {
		t.Fatal(err)
	}
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
		if err := run([]string{"-workload", "burst", "-trace", p}, &bytes.Buffer{}); err != nil {
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
		if len(tr) != 12 {
			t.Fatalf("%s: %d rows, want 12", name, len(tr))
		}
	}
	if err := run([]string{"-workload", "burst,locality", "-trace", filepath.Join(dir, "x")}, &bytes.Buffer{}); err == nil {
		t.Fatal("-trace with two workloads accepted")
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-workload", "nope"},
		{"-policy", "nope", "-workload", "burst"},
		{"-alpha", "-1", "-workload", "burst"},
	} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
