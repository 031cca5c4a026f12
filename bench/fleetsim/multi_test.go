package fleetsim

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

func runPolicy(t *testing.T, w *workload.Workload, p Policy, replicas int, salt uint64) *Result {
	t.Helper()
	res, err := Run(Config{Workload: w, Replicas: replicas, Policy: p, Salt: salt})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func newMulti(t *testing.T, name string, routers int, front Front, seed uint64) Policy {
	t.Helper()
	p, err := NewMulti(name, routers, front, seed, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// One instance behind any front routes exactly as the policy alone; the
// sync variant with several instances routes exactly as one instance
// (one shared state).
func TestMultiOneInstanceIsTheSingle(t *testing.T) {
	w := generate(t, "hotspot", workload.Options{Seed: 2, Replicas: 4, Scale: 0.1})
	tests := []struct {
		name    string
		single  string
		multi   string
		routers int
		front   Front
	}{
		{"ramjet", "ramjet", "ramjet", 1, FrontRandom},
		{"sglang", "sglang", "sglang", 1, FrontRoundRobin},
		{"dynamo", "dynamo", "dynamo", 1, FrontClientHash},
		{"dynamo-sync x4", "dynamo", "dynamo-sync", 4, FrontRoundRobin},
		{"dynamo-tuned-sync x2", "dynamo-tuned", "dynamo-tuned-sync", 2, FrontRandom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPolicy(tt.single, 2, selection.Config{})
			if err != nil {
				t.Fatal(err)
			}
			want := runPolicy(t, w, p, 4, 2)
			got := runPolicy(t, w, newMulti(t, tt.multi, tt.routers, tt.front, 2), 4, 2)
			if diff := cmp.Diff(want.Records, got.Records); diff != "" {
				t.Fatalf("records differ (-single +multi):\n%s", diff)
			}
		})
	}
}

// Each instance counts only its own requests: its view's in-flight
// counts return to zero, its routed counts sum to the fleet's, and every
// instance but a shared one routed some.
func TestMultiInstancesCountTheirOwn(t *testing.T) {
	w := generate(t, "agent-fleet", workload.Options{Seed: 1, Scale: 0.1})
	for _, name := range []string{"ramjet", "sglang", "dynamo"} {
		t.Run(name, func(t *testing.T) {
			p := newMulti(t, name, 3, FrontRoundRobin, 1)
			res := runPolicy(t, w, p, 4, 1)
			m := multiOf(p)
			sum := make([]int, 4)
			for k, v := range m.views {
				if m.Dispatched[k] == 0 {
					t.Errorf("instance %d got no request", k)
				}
				routed := 0
				for i, r := range v {
					if r.InFlight != 0 {
						t.Errorf("instance %d replica %d: %d still in flight", k, i, r.InFlight)
					}
					sum[i] += r.Routed
					routed += r.Routed
				}
				if routed != m.Dispatched[k] {
					t.Errorf("instance %d routed %d, dispatched %d", k, routed, m.Dispatched[k])
				}
			}
			if diff := cmp.Diff(res.Routed, sum); diff != "" {
				t.Errorf("per-replica routed (-fleet +sum of instances):\n%s", diff)
			}
			if len(m.owner) != 0 {
				t.Errorf("%d requests still owned", len(m.owner))
			}
		})
	}
}

// ramjet instances keep their own state: each instance's router learns
// only from its own traffic, so two instances' indexes differ.
func TestMultiRamjetIndexesAreOwn(t *testing.T) {
	w := generate(t, "locality", workload.Options{Seed: 1, Scale: 0.5})
	p := newMulti(t, "ramjet", 2, FrontClientHash, 1)
	runPolicy(t, w, p, 4, 1)
	m := multiOf(p)
	a, b := m.inst[0].(*Ramjet).Router(), m.inst[1].(*Ramjet).Router()
	if a == b {
		t.Fatal("instances share one router")
	}
	ea, eb := a.Index().Entries(), b.Index().Entries()
	if ea == 0 || eb == 0 {
		t.Fatalf("index entries %d and %d: an instance learned nothing", ea, eb)
	}
}

func TestMultiFronts(t *testing.T) {
	w := generate(t, "locality", workload.Options{Seed: 3, Scale: 0.5})
	const k = 4
	tests := []struct {
		front Front
		check func(t *testing.T, m *Multi, bySession map[int]map[int]bool)
	}{
		{FrontRoundRobin, func(t *testing.T, m *Multi, _ map[int]map[int]bool) {
			lo, hi := m.Dispatched[0], m.Dispatched[0]
			for _, d := range m.Dispatched {
				lo, hi = min(lo, d), max(hi, d)
			}
			if hi-lo > 1 {
				t.Errorf("round robin dispatched %v", m.Dispatched)
			}
		}},
		{FrontRandom, func(t *testing.T, m *Multi, _ map[int]map[int]bool) {
			for i, d := range m.Dispatched {
				if d == 0 {
					t.Errorf("random sent nothing to instance %d of %v", i, m.Dispatched)
				}
			}
		}},
		{FrontClientHash, func(t *testing.T, m *Multi, bySession map[int]map[int]bool) {
			for s, insts := range bySession {
				if len(insts) != 1 {
					t.Errorf("session %d went to instances %v", s, insts)
				}
			}
			used := 0
			for _, d := range m.Dispatched {
				if d > 0 {
					used++
				}
			}
			if used < 2 {
				t.Errorf("client hash used %d of %d instances: %v", used, k, m.Dispatched)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.front.String(), func(t *testing.T) {
			p := newMulti(t, "ramjet", k, tt.front, 3)
			m := multiOf(p)
			bySession := map[int]map[int]bool{}
			for _, r := range w.Trace {
				inst := m.instance(&Request{Row: r})
				if bySession[r.Session] == nil {
					bySession[r.Session] = map[int]bool{}
				}
				bySession[r.Session][inst] = true
				m.Dispatched[inst]++
			}
			tt.check(t, m, bySession)
		})
	}
}

func TestParseFront(t *testing.T) {
	for i, n := range FrontNames {
		f, err := ParseFront(n)
		if err != nil || f != Front(i) || f.String() != n {
			t.Errorf("ParseFront(%q) = %v, %v", n, f, err)
		}
	}
	if _, err := ParseFront("dns"); err == nil {
		t.Error("ParseFront(dns): no error")
	}
	if _, err := NewMulti("llm-d", 2, FrontRoundRobin, 1, selection.Config{}); err == nil {
		t.Error("NewMulti(llm-d): no error (no documented active-active mode)")
	}
	if _, err := NewMulti("ramjet", 0, FrontRoundRobin, 1, selection.Config{}); err == nil {
		t.Error("NewMulti(routers 0): no error")
	}
}

// burstSpread runs the first round of the burst workload (12 concurrent
// requests of one app, 4k-token shared prompt) on 8 replicas through
// routers ramjet instances dealt round robin and returns how many replicas
// served it.
func burstSpread(t *testing.T, routers int) int {
	t.Helper()
	return burstSpreadOf(t, "ramjet", routers)
}

// burstSpreadOf is burstSpread with the multi-router policy name (e.g.
// "ramjet~same").
func burstSpreadOf(t *testing.T, name string, routers int) int {
	t.Helper()
	w := generate(t, "burst", workload.Options{Seed: 1, Replicas: 8, Scale: 0.125})
	var round workload.Trace
	for _, r := range w.Trace {
		if r.Group == w.Trace[0].Group {
			r.ID = len(round)
			round = append(round, r)
		}
	}
	if len(round) != 12 {
		t.Fatalf("burst round has %d requests, want 12", len(round))
	}
	w.Trace = round
	res := runPolicy(t, w, newMulti(t, name, routers, FrontRoundRobin, 1), 8, 1)
	used := 0
	for _, n := range res.Routed {
		if n > 0 {
			used++
		}
	}
	t.Logf("%s x%d rr: 12-request same-prefix burst over %d of 8 replicas, per replica %v", name, routers, used, res.Routed)
	return used
}

// One instance spreads a same-prefix burst of 12 over at least 7 of 8
// replicas (its reservations push the later requests off the first
// choices).
func TestMultiBurstOneInstance(t *testing.T) {
	if used := burstSpread(t, 1); used < 7 {
		t.Errorf("one instance: burst over %d of 8 replicas, want >= 7", used)
	}
}

// Issue 13's acceptance: the same burst split over 4 independent
// instances still spreads over at least 7 of 8 replicas. Every instance
// ranks the cold prefix's replicas alike (rendezvous) and sees only its
// own reservations; the instances named by ordinals 0..3 (a StatefulSet's
// pods, Multi's default) spill at spread positions of that order
// (selection.Router.SetInstance), so they agree on the first choice and
// not on the spills. With one shared spill order ("~same", the rule
// before) they pile onto 3 replicas.
func TestMultiBurstFourInstances(t *testing.T) {
	if used := burstSpread(t, 4); used < 7 {
		t.Errorf("4 instances: burst over %d of 8 replicas, want >= 7", used)
	}
	if used := burstSpreadOf(t, "ramjet~same", 4); used > 4 {
		t.Errorf("4 instances with one shared spill order: burst over %d of 8 replicas; the pile-up this fixes is gone, re-check the test", used)
	}
}

// Instances named at random (hostnames: hashed positions) spread the
// burst less evenly than ordinals. The figure per set of names is
// reported; over 20 sets the median must still reach 6 of 8 (the shared
// order gives 3).
func TestMultiBurstHashedInstances(t *testing.T) { hashedBurstSpread(t, "ramjet~inst=host-%c%d") }

// hashedBurstSpread runs the burst over 4 instances of the policy spec
// format (its %c%d: one host name per set) for 20 name sets, logs the
// replicas used per set, and wants the upper median at 6 of 8 or more.
func hashedBurstSpread(t *testing.T, format string) {
	t.Helper()
	var got []int
	for i := range 20 {
		got = append(got, burstSpreadOf(t, fmt.Sprintf(format, 'a'+i, i*7919), 4))
	}
	slices.Sort(got)
	t.Logf("4 instances of %s: replicas used per name set, sorted: %v", format, got)
	if med := got[len(got)/2]; med < 6 {
		t.Errorf("median %d of 8 replicas over 20 name sets, want >= 6", med)
	}
}
