package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2ECompareSolo builds the ramjet Caddy binary and replays one burst
// round through ramjet-precise with Caddy in its own process (-caddy-bin):
// every request completes, the row carries the Caddy process's CPU time,
// the Caddy process was profiled through its admin endpoint (handed over
// as a listener, no fixed port) and its kv metrics were scraped.
func TestE2ECompareSolo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the caddy binary (about a minute)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "caddy")
	build := exec.Command("go", "build", "-o", bin, "github.com/ramjet-llm/ramjet/xcaddy")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build xcaddy: %v\n%s", err, out)
	}
	prof := filepath.Join(dir, "p")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-workload", "burst", "-scale", "0.125", "-policy", "ramjet-precise",
		"-caddy-bin", bin, "-caddy-profile-chunk", "1s", "-cpuprofile", prof, "-replicas", "8", "-time-scale", "2", "-json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 1 || rows[0].Policy != "ramjet-precise (caddy process)" {
		t.Fatalf("rows: %+v", rows)
	}
	r := rows[0]
	if r.OK != 12 || r.Failed != 0 || r.CaddyCPUSeconds <= 0 {
		t.Errorf("row: completed %d failed %d caddy cpu %v", r.OK, r.Failed, r.CaddyCPUSeconds)
	}
	if !strings.Contains(errOut.String(), `ramjet_kv_decisions_total{mode="approximate"}`) {
		t.Errorf("no kv metrics scraped:\n%s", errOut.String())
	}
	st, err := os.Stat(prof + "-0-burst-ramjet-precise-router-caddy-0.pprof")
	if err != nil || st.Size() == 0 {
		t.Errorf("caddy profile: %v %v", st, err)
	}
}
