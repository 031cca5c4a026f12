package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
)

// TestRestartSmoke runs the snapshot arm once at a small scale through the
// real Caddy and engine simulators: the clean stop writes a snapshot, the
// new Caddy loads it, and the window after the restart has requests. The
// drain is only a bound (the run waits for the window's requests and no
// longer): a loaded machine can stretch the restart and the requests it
// held by tens of seconds.
func TestRestartSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real Caddy restart")
	}
	var out, errs bytes.Buffer
	err := run(context.Background(), []string{"-workload", "shared-prefix", "-seeds", "1", "-arms", "snapshot",
		"-scale", "0.25", "-time-scale", "40", "-drain", "60m", "-json"}, &out, &errs)
	if err != nil {
		t.Fatalf("%v\n%s", err, errs.String())
	}
	var rows []Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rows))
	}
	r := rows[0]
	if !r.Loaded || r.SnapshotBytes == 0 {
		t.Errorf("snapshot %d bytes, loaded %t: want a snapshot written and loaded", r.SnapshotBytes, r.Loaded)
	}
	if r.Requests == 0 || r.Failed != 0 {
		t.Errorf("window: %d requests, %d failed (first: %s; restart downtime %.1f s wall); want some, none failed",
			r.Requests, r.Failed, r.FirstError, r.Downtime)
	}
}
