package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/fleetsim"
)

func TestMultiRouters(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "rows.json")
	var out bytes.Buffer
	args := []string{"-short", "-seeds", "1,2", "-workload", "burst", "-replicas", "8",
		"-routers", "1,2,4", "-front", "client-hash", "-policy", "ramjet,dynamo-sync", "-json", jsonPath}
	if err := run(args, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "### burst, several routers (") {
		t.Fatalf("no table:\n%s", out.String())
	}
	rows := readJSON[[]fleetsim.MultiRow](t, jsonPath)
	// ramjet x1, x2, x4; dynamo x1 (dynamo-sync's one instance), dynamo-sync x2, x4.
	var got []string
	for _, r := range rows {
		got = append(got, r.Policy)
		if r.Seeds != 2 || r.Front != "client-hash" {
			t.Errorf("%s: seeds %d, front %q", r.Policy, r.Seeds, r.Front)
		}
	}
	want := "ramjet x1 client-hash,ramjet x2 client-hash,ramjet x4 client-hash,dynamo x1 client-hash,dynamo-sync x2 client-hash,dynamo-sync x4 client-hash"
	if strings.Join(got, ",") != want {
		t.Fatalf("rows %q, want %q", strings.Join(got, ","), want)
	}
	for _, i := range []int{0, 4} { // ramjet x1; dynamo-sync x4 (one shared state: dynamo x1)
		if v := rows[i].VsOne; v.CachedShare != 1 || v.TTFTp50 != 1 || v.TTFTp99 != 1 || v.OutputTPS != 1 {
			t.Errorf("%s against one instance: %+v", rows[i].Policy, v)
		}
	}
}

func TestMultiRoutersBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-workload", "burst", "-short", "-routers", "0"},
		{"-workload", "burst", "-short", "-routers", "2", "-front", "dns"},
		{"-workload", "burst", "-short", "-routers", "2", "-policy", "llm-d"},
	} {
		if err := run(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
