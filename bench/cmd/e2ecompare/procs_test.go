package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestE2ECompareProcs builds the ramjet Caddy binary and replays one
// burst round through four separate Caddy processes behind the
// round-robin front: every request completes, the front deals them
// evenly, and the instances (named ramjet-0..3, so spilling at spread
// positions) use at least 7 of the 8 engines, as the simulation's
// TestMultiBurstFourInstances does. Time runs at 2x (not 20x) so that the
// burst's 12 requests are in flight together even on a loaded machine: at
// 20x a burst lasted about 30 ms of wall time, and under load the later
// requests came after the first had ended and followed them by affinity
// (5-6 of 8 engines in 1 of 4 runs beside another go test).
func TestE2ECompareProcs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the caddy binary (about a minute)")
	}
	bin := filepath.Join(t.TempDir(), "caddy")
	build := exec.Command("go", "build", "-o", bin, "github.com/ramjet-llm/ramjet/xcaddy")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build xcaddy: %v\n%s", err, out)
	}
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-workload", "burst", "-scale", "0.125", "-policy", "round_robin",
		"-routers", "4", "-front", "rr", "-procs", bin, "-replicas", "8", "-time-scale", "2", "-json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 2 || rows[1].Policy != "ramjet x4 procs rr" {
		t.Fatalf("rows: %+v", rows)
	}
	r := rows[1]
	t.Logf("%s: replicas used %d of 8, cached %.3f, front %v", r.Policy, r.ReplicasUsed, r.Cached, r.Front)
	if r.OK != 12 || r.Failed != 0 || r.TTFTp50 <= 0 {
		t.Errorf("%s: %+v", r.Policy, r)
	}
	if !slices.Equal(r.Front, []int64{3, 3, 3, 3}) {
		t.Errorf("front dealt %v, want [3 3 3 3]", r.Front)
	}
	if r.ReplicasUsed < 7 {
		t.Errorf("4 processes: burst over %d of 8 engines, want >= 7", r.ReplicasUsed)
	}
}
