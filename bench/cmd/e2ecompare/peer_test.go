package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// TestE2ECompareRunsPeersInCaddy replays one round of the burst workload
// through two of the fleet simulation's peers inside the real Caddy: SGLang
// (its own approximate tree) and Dynamo (the engines' KV events over ZMQ),
// and checks every request was routed by the peer, Dynamo's engines
// published events and the markdown names the adapter's record.
func TestE2ECompareRunsPeersInCaddy(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-workload", "burst", "-scale", "0.125", "-policy", "sglang,dynamo",
		"-replicas", "4", "-time-scale", "20", "-kv-events", "precise", "-json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 2 || rows[0].Policy != "sglang" || rows[1].Policy != "dynamo" {
		t.Fatalf("rows: %+v", rows)
	}
	for _, r := range rows {
		if r.OK != 12 || r.Failed != 0 || r.Peer == nil || r.Peer.Requests != 12 || r.Peer.Picks != 12 || r.Peer.Fallbacks != 0 {
			t.Errorf("%s: %+v peer %+v", r.Policy, r, r.Peer)
		}
	}
	if rows[0].Peer != nil && rows[0].Peer.KVEvents != 0 {
		t.Errorf("sglang applied %d KV events: its engines should not publish with -kv-events precise", rows[0].Peer.KVEvents)
	}
	if rows[1].Peer != nil && rows[1].Peer.KVEvents == 0 {
		t.Error("dynamo applied no KV events")
	}
	if md := markdown(rows); !strings.Contains(md, "burst/dynamo (fleetsim's policy in Caddy): 12 requests tokenized, 12 picks, 0 not routed by it") {
		t.Errorf("markdown:\n%s", md)
	}
}
