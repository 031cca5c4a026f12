package fleetsim

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

func generate(t *testing.T, name string, o workload.Options) *workload.Workload {
	t.Helper()
	w, err := workload.Generate(name, o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func runOne(t *testing.T, w *workload.Workload, policy string, replicas int, seed uint64) *Result {
	t.Helper()
	p, err := NewPolicy(policy, seed, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Config{Workload: w, Replicas: replicas, Policy: p, Salt: seed})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestRunDeterministic(t *testing.T) {
	w := generate(t, "hotspot", workload.Options{Seed: 3, Scale: 0.1})
	for _, name := range PolicyNames {
		t.Run(name, func(t *testing.T) {
			a := runOne(t, w, name, 4, 3)
			b := runOne(t, w, name, 4, 3)
			if diff := cmp.Diff(a.Records, b.Records); diff != "" {
				t.Fatalf("two runs with one seed differ (-a +b):\n%s", diff)
			}
			if !cmp.Equal(a.Routed, b.Routed) {
				t.Fatalf("routed %v vs %v", a.Routed, b.Routed)
			}
		})
	}
}

func TestRunCompletesEveryRequest(t *testing.T) {
	// Closed loop: every agent turn waits for the previous one, so all
	// of them finishing proves the dependencies were released.
	w := generate(t, "agent-fleet", workload.Options{Seed: 2, Scale: 0.1})
	res := runOne(t, w, "ramjet", 4, 2)
	for _, r := range res.Records {
		if r.Err != "" {
			t.Fatalf("request %d refused: %s", r.ID, r.Err)
		}
		if !(r.Sent <= r.First && r.First <= r.Done) {
			t.Fatalf("request %d: sent %v first %v done %v out of order", r.ID, r.Sent, r.First, r.Done)
		}
		if row := w.Trace[r.ID]; row.After >= 0 {
			parent := res.Records[row.After]
			if r.Sent < parent.Done+row.Think-1e-9 {
				t.Fatalf("request %d sent at %v before its parent finished at %v plus think %v", r.ID, r.Sent, parent.Done, row.Think)
			}
		}
	}
	// Later turns of a conversation hit the cache.
	s := Summarize(res)
	if s.CachedShare < 0.5 {
		t.Fatalf("cached share %.2f on an agent fleet, want > 0.5", s.CachedShare)
	}
}

func TestRamjetReleasesReservations(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 1, Scale: 0.05, Replicas: 4})
	p, err := NewRamjet(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(Config{Workload: w, Replicas: 4, Policy: p, Salt: 1}); err != nil {
		t.Fatal(err)
	}
	rt := p.Router()
	for s := range rt.Len() {
		inflight, pending := rt.Load(selection.Slot(s))
		if inflight != 0 || pending != 0 {
			t.Fatalf("slot %d left with %d in flight, %d pending prefill", s, inflight, pending)
		}
	}
	if rt.Index().Entries() == 0 {
		t.Fatal("the index learned nothing")
	}
}

// Acceptance: ramjet uses at least 7 of 8 replicas in burst.
func TestRamjetBurstSpreads(t *testing.T) {
	w := generate(t, "burst", workload.Options{Seed: 1})
	s := Summarize(runOne(t, w, "ramjet", 8, 1))
	if s.ReplicasUsed < 7 {
		t.Fatalf("ramjet used %d of 8 replicas in burst, want >= 7", s.ReplicasUsed)
	}
}

func TestOracleShare(t *testing.T) {
	// Two sessions of one group, two turns each; block size 16.
	rows := workload.Trace{
		{ID: 0, After: -1, Session: 0, Turn: 0, Group: 0, Prefix: 160, Input: 200, Output: 40},
		{ID: 1, After: 0, Session: 0, Turn: 1, Group: 0, Prefix: 160, Input: 260, Output: 10},
		{ID: 2, After: -1, Session: 1, Turn: 0, Group: 0, Prefix: 160, Input: 200, Output: 10},
	}
	w := &workload.Workload{Name: "t", Trace: rows}
	share, cached, prompt := OracleShare(w, 1, 16)
	// Row 0: cold. Row 1 extends row 0's prompt and output (240 tokens,
	// 15 full blocks = 240). Row 2 shares the 160-token prefix (10
	// blocks).
	if cached != 240+160 || prompt != 660 {
		t.Fatalf("cached %d of %d, want 400 of 660", cached, prompt)
	}
	if math.Abs(share-400.0/660) > 1e-12 {
		t.Fatalf("share %v", share)
	}
}

func TestNoPolicyBeatsTheOracle(t *testing.T) {
	for _, name := range []string{"locality", "hotspot"} {
		w := generate(t, name, workload.Options{Seed: 5, Scale: 0.2})
		bound, _, _ := OracleShare(w, 5, 16)
		for _, p := range PolicyNames {
			s := Summarize(runOne(t, w, p, 4, 5))
			if s.CachedShare > bound+1e-9 {
				t.Fatalf("%s on %s: cached share %.4f above the oracle %.4f", p, name, s.CachedShare, bound)
			}
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	w := generate(t, "burst", workload.Options{Seed: 1})
	p, _ := NewPolicy("round-robin", 1, selection.Config{})
	for _, n := range []int{0, selection.MaxReplicas + 1} {
		if _, err := Run(Config{Workload: w, Replicas: n, Policy: p}); err == nil {
			t.Fatalf("replicas %d accepted", n)
		}
	}
	if _, err := NewPolicy("nope", 1, selection.Config{}); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if _, err := NewPolicy("ramjet", 1, selection.Config{Alpha: -1}); err == nil {
		t.Fatal("bad ramjet config accepted")
	}
}

func TestSixtyFourReplicas(t *testing.T) {
	out, err := RunSuite(SuiteConfig{
		Workloads: []string{"hotspot", "shared-prefix"}, Policies: PolicyNames,
		Replicas: 64, Seed: 1, Scale: 0.05,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, wr := range out {
		for _, r := range wr.Rows {
			if r.Replicas != 64 {
				t.Fatalf("%s: %d replicas", r.Policy, r.Replicas)
			}
			if r.Policy != Oracle && (r.Failed > 0 || r.Requests != len(wr.Workload.Trace)) {
				t.Fatalf("%s on %s: %d of %d requests, %d failed", r.Policy, r.Workload, r.Requests, len(wr.Workload.Trace), r.Failed)
			}
		}
	}
}

// TestSuiteShort is the CI form of the whole suite: every workload, every
// policy, a tenth of the requests.
func TestSuiteShort(t *testing.T) {
	out, err := RunSuite(SuiteConfig{Workloads: workload.Names, Policies: PolicyNames, Replicas: 8, Seed: 1, Scale: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(workload.Names) {
		t.Fatalf("%d workloads", len(out))
	}
	var buf bytes.Buffer
	for _, wr := range out {
		if len(wr.Rows) != len(PolicyNames)+1 || wr.Rows[len(wr.Rows)-1].Policy != Oracle {
			t.Fatalf("%s: rows %d, want every policy then the oracle", wr.Workload.Name, len(wr.Rows))
		}
		oracle := wr.Rows[len(wr.Rows)-1].CachedShare
		for _, r := range wr.Rows[:len(PolicyNames)] {
			if r.Failed != 0 {
				t.Fatalf("%s on %s: %d failed", r.Policy, r.Workload, r.Failed)
			}
			if r.CachedShare > oracle+1e-9 || r.TTFTp50 <= 0 || r.TTFTp50 > r.TTFTp95 || r.TTFTp95 > r.TTFTp99 || r.OutputTPS <= 0 {
				t.Fatalf("implausible row %+v (oracle %.3f)", r, oracle)
			}
		}
		if wr.Rows[0].VsBest == nil {
			t.Fatalf("%s: no ramjet-vs-best-peer ratios", wr.Workload.Name)
		}
		WriteTable(&buf, wr.Workload.Name, wr.Rows)
	}
	if !strings.Contains(buf.String(), "ramjet vs best peer") {
		t.Fatal("table lacks the comparison line")
	}
}

func TestCompareToPeers(t *testing.T) {
	rows := []Summary{
		{Policy: "ramjet", CachedShare: 0.6, TTFTp50: 1, TTFTp95: 2, TTFTp99: 3, OutputTPS: 100},
		{Policy: "a", CachedShare: 0.5, TTFTp50: 2, TTFTp95: 1, TTFTp99: 6, OutputTPS: 50},
		{Policy: "b", CachedShare: 0.3, TTFTp50: 4, TTFTp95: 4, TTFTp99: 3, OutputTPS: 200},
		{Policy: Oracle, CachedShare: 0.9},
	}
	CompareToPeers(rows)
	v := rows[0].VsBest
	want := &Ratios{CachedShare: 1.2, TTFTp50: 0.5, TTFTp95: 2, TTFTp99: 1, OutputTPS: 0.5,
		Best: map[string]string{"cached_share": "a", "ttft_p50": "a", "ttft_p95": "a", "ttft_p99": "b", "output_tokens_per_s": "b"}}
	if diff := cmp.Diff(want, v, cmp.Comparer(func(x, y float64) bool { return math.Abs(x-y) < 1e-9 })); diff != "" {
		t.Fatalf("ratios (-want +got):\n%s", diff)
	}
	if rows[1].VsBest != nil || rows[3].VsBest != nil {
		t.Fatal("ratios on a peer row")
	}
}

func TestWriteCDF(t *testing.T) {
	var buf bytes.Buffer
	err := WriteCDF(&buf, "TTFT <test> & co", "TTFT (s)", []Series{
		{Name: "ramjet", Values: []float64{0.1, 0.2, 0.5, 3}},
		{Name: "round-robin", Values: []float64{0.3, 1, 10}},
		{Name: "empty"},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Well-formed XML with one polyline per non-empty series.
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	lines := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("invalid SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			lines++
		}
	}
	if lines != 2 {
		t.Fatalf("%d polylines, want 2", lines)
	}
	for _, s := range []string{"ramjet", "round-robin", "TTFT &lt;test&gt; &amp; co"} {
		if !strings.Contains(buf.String(), s) {
			t.Fatalf("SVG lacks %q", s)
		}
	}
}

func TestSweepPicksAndRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("sweep runs every knob value")
	}
	points, best, err := Sweep(SweepConfig{Suite: SuiteConfig{Workloads: []string{"burst", "locality"}, Replicas: 4, Seed: 1, Scale: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range Knobs() {
		n += len(k.Values)
	}
	if len(points) != n {
		t.Fatalf("%d points, want %d", len(points), n)
	}
	chosen := map[string]float64{}
	for _, p := range points {
		if p.Chosen {
			if _, dup := chosen[p.Knob]; dup {
				t.Fatalf("two values chosen for %s", p.Knob)
			}
			chosen[p.Knob] = p.Value
		}
		if !(p.Objective > 0) {
			t.Fatalf("point %+v has no objective", p)
		}
	}
	if len(chosen) != len(Knobs()) {
		t.Fatalf("chosen %v", chosen)
	}
	if float64(best.AffinityCap) != chosen["affinity_cap"] || best.Alpha != chosen["alpha"] ||
		float64(best.RequestCost) != chosen["request_cost"] || float64(best.PrefixTokens) != chosen["prefix_tokens"] ||
		float64(best.IndexBudget) != chosen["index_budget"] {
		t.Fatalf("best %+v does not match the chosen points %v", best, chosen)
	}
	if err := best.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Fleets past the old 128-replica limit run through the shipped Route
// call: every request completes and a burst uses the whole fleet.
func TestThousandReplicas(t *testing.T) {
	for _, n := range []int{256, 1024} {
		w := generate(t, "burst", workload.Options{Seed: 1, Scale: 0.1, Replicas: n})
		res := runOne(t, w, "ramjet", n, 1)
		s := Summarize(res)
		if s.Failed > 0 || s.Requests != len(w.Trace) {
			t.Fatalf("%d replicas: %d of %d requests, %d failed", n, s.Requests, len(w.Trace), s.Failed)
		}
		if used := s.ReplicasUsed; used < n*9/10 {
			t.Fatalf("%d replicas: burst used %d", n, used)
		}
	}
}
