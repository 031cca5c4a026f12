package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestE2ECompareSmoke replays the burst workload through ramjet and
// round_robin and checks both rows are complete.
func TestE2ECompareSmoke(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-workload", "burst", "-policy", "ramjet,round_robin", "-replicas", "4", "-time-scale", "20", "-json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 2 || rows[0].Policy != "ramjet" || rows[1].Policy != "round_robin" {
		t.Fatalf("rows: %+v", rows)
	}
	for _, r := range rows {
		if r.OK != 12 || r.Requests != 12 || r.Failed != 0 || r.ReplicasUsed == 0 || r.MaxMeanLoad < 1 || r.TTFTp50 <= 0 {
			t.Errorf("%s: %+v", r.Policy, r)
		}
	}
	if md := markdown(rows); !strings.Contains(md, "| burst | ramjet | 12/12 |") {
		t.Errorf("markdown:\n%s", md)
	}
}
