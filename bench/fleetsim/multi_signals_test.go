package fleetsim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// signalSpy records the engine signals Multi hands an instance.
type signalSpy struct {
	hooks
	scraped  [][]*Replica
	observed []int // trace IDs
}

func (*signalSpy) Name() string                  { return "spy" }
func (*signalSpy) Pick(*Request, []*Replica) int { return 0 }
func (s *signalSpy) ScrapeEngines(_ time.Duration, fleet []*Replica) {
	s.scraped = append(s.scraped, fleet)
}
func (s *signalSpy) Observe(r *Request, _ int, _ engine.Usage) {
	s.observed = append(s.observed, r.Row.ID)
}

// Multi hands every instance the scrape through its own view (the
// engines' KV capacity in it) and each answer's usage to the instance
// that routed it, not to the others.
func TestMultiForwardsScrapeAndObserve(t *testing.T) {
	p := newMulti(t, "ramjet", 2, FrontRoundRobin, 1)
	m := multiOf(p)
	spies := []*signalSpy{{}, {}}
	m.inst = []Policy{spies[0], spies[1]}
	fleet, _ := fleetOf(3)
	for i, r := range fleet {
		r.KVCapacity = 1000 * (i + 1)
	}
	r0, r1 := req(10, 0, 0, 64), req(11, 0, 0, 64)
	m.Routed(r0, m.Pick(r0, fleet)) // instance 0
	m.Routed(r1, m.Pick(r1, fleet)) // instance 1
	m.ScrapeEngines(time.Second, fleet)
	for k, s := range spies {
		if len(s.scraped) != 1 {
			t.Fatalf("instance %d scraped %d times, want 1", k, len(s.scraped))
		}
		v := s.scraped[0]
		if v[0] == fleet[0] {
			t.Fatalf("instance %d scraped the fleet, not its view", k)
		}
		for i := range v {
			if v[i].KVCapacity != fleet[i].KVCapacity {
				t.Errorf("instance %d replica %d: view KVCapacity %d, fleet %d", k, i, v[i].KVCapacity, fleet[i].KVCapacity)
			}
			own := 0
			if i == 0 {
				own = 1 // the spies pick replica 0
			}
			if v[i].InFlight != own {
				t.Errorf("instance %d replica %d: view in flight %d, want its own only", k, i, v[i].InFlight)
			}
		}
	}
	m.Observe(r1, 0, engine.Usage{PromptTokens: 64, CachedTokens: 0})
	m.Observe(r0, 0, engine.Usage{PromptTokens: 64, CachedTokens: 0})
	if diff := cmp.Diff([]int{10}, spies[0].observed); diff != "" {
		t.Errorf("instance 0 observed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{11}, spies[1].observed); diff != "" {
		t.Errorf("instance 1 observed (-want +got):\n%s", diff)
	}
}

// One ramjet instance behind Multi is the single policy with the engine
// signals too (capacity, Observe, engine-load scrapes); with two
// instances each scrape finds the other's requests on the engines.
func TestMultiRamjetEngineLoad(t *testing.T) {
	w := generate(t, "agent-fleet", workload.Options{Seed: 1, Scale: 0.1})
	oneIsTheSingle(t, w, "ramjet@el=0.25", 8)

	p := newMulti(t, "ramjet@el=0.25", 2, FrontRoundRobin, 1)
	runPolicy(t, w, p, 8, 1)
	for k, inst := range multiOf(p).inst {
		rj := inst.(*Ramjet)
		if rj.Scrapes() < 10 {
			t.Errorf("instance %d: %d scrapes, want many at 250ms", k, rj.Scrapes())
		}
		if rj.ExternalSeen() == 0 {
			t.Errorf("instance %d found no external requests beside another instance", k)
		}
		if c := rj.Router().Capacity(rj.cands[0].Slot); c <= 0 {
			t.Errorf("instance %d: replica 0 capacity %d, want the engine's", k, c)
		}
	}
}

// ramjet-precise instances each read every engine's KV events into their
// own index: one instance behind Multi is the single policy, and with two
// each index mirrors the engines (both receive every event).
func TestMultiRamjetPrecise(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 1, Scale: 0.1})
	oneIsTheSingle(t, w, "ramjet-precise", 4)
	p := newMulti(t, "ramjet-precise", 2, FrontRoundRobin, 1)
	runPolicy(t, w, p, 4, 1)
	insts := multiOf(p).inst
	a, b := insts[0].(*RamjetPrecise), insts[1].(*RamjetPrecise)
	if a.EventsQueued == 0 || a.EventsQueued != b.EventsQueued {
		t.Fatalf("events received %d and %d, want every event by both", a.EventsQueued, b.EventsQueued)
	}
	if a.PreciseDecisions() == 0 || b.PreciseDecisions() == 0 {
		t.Fatalf("precise decisions %d and %d", a.PreciseDecisions(), b.PreciseDecisions())
	}
}

// oneIsTheSingle checks that one instance of policy behind Multi routes w
// exactly as the policy alone, record for record.
func oneIsTheSingle(t *testing.T, w *workload.Workload, policy string, replicas int) {
	t.Helper()
	single, err := NewPolicy(policy, 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := runPolicy(t, w, single, replicas, 1)
	got := runPolicy(t, w, newMulti(t, policy, 1, FrontRoundRobin, 1), replicas, 1)
	if diff := cmp.Diff(want.Records, got.Records); diff != "" {
		t.Fatalf("%s: records differ (-single +multi x1):\n%s", policy, diff)
	}
}
