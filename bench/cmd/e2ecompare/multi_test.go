package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
)

// TestE2ECompareRouters replays one burst round through one ramjet and
// through two independent ramjet instances behind the round-robin front:
// every request completes, the front deals them evenly, and the engines
// report cached tokens through both.
func TestE2ECompareRouters(t *testing.T) {
	var out, errOut bytes.Buffer
	prefix := filepath.Join(t.TempDir(), "res")
	err := run(context.Background(), []string{"-workload", "burst", "-scale", "0.125", "-policy", "ramjet",
		"-routers", "2", "-front", "rr", "-replicas", "4", "-time-scale", "20", "-json", "-results", prefix}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rows []Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 2 || rows[0].Policy != "ramjet" || rows[1].Policy != "ramjet x2 rr" {
		t.Fatalf("rows: %+v", rows)
	}
	for _, r := range rows {
		if r.OK != 12 || r.Failed != 0 || r.ReplicasUsed == 0 || r.TTFTp99 < r.TTFTp50 || r.TTFTp50 <= 0 {
			t.Errorf("%s: %+v", r.Policy, r)
		}
		t.Logf("%s: replicas used %d of 4, cached %.3f, front %v", r.Policy, r.ReplicasUsed, r.Cached, r.Front)
	}
	if !slices.Equal(rows[1].Front, []int64{6, 6}) {
		t.Errorf("front dealt %v, want [6 6]", rows[1].Front)
	}
	if rows[0].Front != nil {
		t.Errorf("single-instance row has front counts %v", rows[0].Front)
	}
	// -results: one JSON line per request of each run, the multi row's too.
	for _, name := range []string{prefix + "-0-burst-ramjet.jsonl", prefix + "-1-burst-ramjet-x2.jsonl"} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(b, []byte("\n")); n != 12 {
			t.Errorf("%s: %d lines, want 12", filepath.Base(name), n)
		}
	}
}

func TestParseRouters(t *testing.T) {
	got, fp, err := parseRouters("2, 4", "random")
	if err != nil || !slices.Equal(got, []int{2, 4}) || fp.String() != "random" {
		t.Errorf("parseRouters: %v %v %v", got, fp, err)
	}
	for _, bad := range [][2]string{{"0", "rr"}, {"x", "rr"}, {"2", "hash"}} {
		if _, _, err := parseRouters(bad[0], bad[1]); err == nil {
			t.Errorf("parseRouters(%q, %q): no error", bad[0], bad[1])
		}
	}
}

func TestSummarizeKV(t *testing.T) {
	got := summarizeKV([]string{
		`ramjet_kv_decisions_total{mode="precise",state_key="a"} 10`,
		`ramjet_kv_decisions_total{mode="approximate",state_key="a"} 3`,
		`ramjet_kv_events_applied_total{state_key="a"} 7`,
		`ramjet_kv_feed_connected{state_key="a",upstream="x"} 1`,
		`ramjet_kv_feed_connected{state_key="a",upstream="y"} 1`,
		`ramjet_tokenize_fallbacks_total{reason="timeout",state_key="a"} 2`,
		`ramjet_tokenize_duration_seconds_sum 1.5`,
		`garbage`,
	})
	want := "kv_decisions_total{mode=precise}=10 kv_decisions_total{mode=approximate}=3 kv_events_applied_total=7 " +
		"kv_feed_connected=2 tokenize_fallbacks_total{reason=timeout}=2 tokenize_duration_seconds_sum=1.5"
	if got != want {
		t.Errorf("summarizeKV:\n got %s\nwant %s", got, want)
	}
}

// TestMultiSitesForeign: -foreign-prefill reaches every instance's policy
// (the module's foreign_prefill), and unset leaves the module's default.
func TestMultiSitesForeign(t *testing.T) {
	ups := []string{"127.0.0.1:1", "127.0.0.1:2"}
	for _, s := range multiSites(2, ups, map[string]any{}, 0, 0, "queues") {
		if got := s.PolicyConfig["foreign_prefill"]; got != "queues" {
			t.Errorf("%s: foreign_prefill %v, want queues", s.Name, got)
		}
	}
	for _, s := range multiSites(2, ups, map[string]any{}, 0, 0, "") {
		if got, ok := s.PolicyConfig["foreign_prefill"]; ok {
			t.Errorf("%s: foreign_prefill %v set without the flag", s.Name, got)
		}
	}
}

// TestMultiSitesKnowTheEnginesCapacity checks that every instance of the
// -routers rows, on either path, is told the engines' KV capacity
// (kv_capacity), as the single-instance rows (siteFor) and the fleet
// simulation's instances are, that the -nocap policies are not, and that
// the real Caddy accepts every instance and routes a request through it.
func TestMultiSitesKnowTheEnginesCapacity(t *testing.T) {
	sims, addrs := startCapacityEngines(t)
	tests := []struct {
		name    string
		give    multiOpts
		wantPol string
		want    any
	}{
		{"ramjet", multiOpts{}, "ramjet", 65536},
		{"ramjet-precise", multiOpts{precise: true}, "ramjet-precise", 65536},
		{"ramjet-nocap", multiOpts{nocap: true}, "ramjet-nocap", nil},
		{"ramjet-precise-nocap", multiOpts{precise: true, nocap: true}, "ramjet-precise-nocap", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sites, pol := multiSitesFor(2, sims, addrs, tt.give)
			if pol != tt.wantPol || len(sites) != 2 {
				t.Fatalf("policy %q with %d sites, want %q with 2", pol, len(sites), tt.wantPol)
			}
			for _, s := range sites {
				if got := s.PolicyConfig["kv_capacity"]; got != tt.want {
					t.Errorf("%s: kv_capacity = %v, want %v", s.Name, got, tt.want)
				}
				if _, kv := s.PolicyConfig["kv"]; kv != tt.give.precise {
					t.Errorf("%s: kv set %v, want %v", s.Name, kv, tt.give.precise)
				}
			}
			helloThroughEach(t, sites, pol)
		})
	}
}

// helloThroughEach starts the real Caddy with sites and sends one chat
// completion through each site, which must succeed (pol names the policy
// in errors).
func helloThroughEach(t *testing.T, sites []caddyrun.Site, pol string) {
	t.Helper()
	running, err := caddyrun.Start(sites)
	if err != nil {
		t.Fatal(err)
	}
	defer caddyrun.Stop()
	for _, s := range sites {
		client, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: running.URL(s.Name), Model: engineModel, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if res := client.Do(context.Background(), []loadgen.Message{{Role: "user", Content: "hello"}}, 4, false); !res.OK() {
			t.Errorf("request through %s of %s: %+v", s.Name, pol, res)
		}
		client.Close()
	}
}
