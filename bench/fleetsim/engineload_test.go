package fleetsim

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// A single ramjet in front of the fleet reserved every request the
// engines hold: the scrapes find no external load, and the run is the
// run without them, decision for decision.
func TestEngineLoadSingleInstanceSeesNoOthers(t *testing.T) {
	w := generate(t, "agent-fleet", workload.Options{Seed: 1, Scale: 0.1})
	plain := runOne(t, w, "ramjet", 8, 1)
	p, err := NewPolicy("ramjet@el=0.25", 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	scraped, err := Run(Config{Workload: w, Replicas: 8, Policy: p, Salt: 1})
	if err != nil {
		t.Fatal(err)
	}
	rj := p.(*Ramjet)
	if rj.Scrapes() < 10 {
		t.Fatalf("%d scrapes over the run, want many at 250ms", rj.Scrapes())
	}
	if rj.ExternalSeen() != 0 {
		t.Fatalf("a lone router found %d external requests", rj.ExternalSeen())
	}
	if diff := cmp.Diff(plain.Records, scraped.Records); diff != "" {
		t.Fatalf("scraping changed a lone router's run (-plain +scraped):\n%s", diff)
	}
}

// Requests another router sent to an engine reach this router's load at
// the next interval boundary, net of its own, and steer a cold request
// away; once they end, the next scrape clears them.
func TestEngineLoadScrapesOthersRequests(t *testing.T) {
	fleet, engines := fleetOf(2)
	for _, r := range fleet {
		r.KVCapacity = 100_000
	}
	p, err := NewRamjetVariant(selection.Config{}, RamjetSetup{EngineLoad: time.Second}, "ramjet-el")
	if err != nil {
		t.Fatal(err)
	}
	rq := func(id int) *Request {
		toks := make([]uint32, 4096)
		for i := range toks {
			toks[i] = uint32(id*1_000_003 + i)
		}
		return &Request{Row: workload.Request{ID: id, Input: len(toks), Output: 16}, Prompt: toks}
	}

	// One request of ours on replica 0, running on its engine, plus three
	// of another router's there.
	first := p.Pick(rq(1), fleet)
	engines[first].running = 4
	engines[first].kv = 0.2
	other := 1 - first
	p.ScrapeEngines(1500*time.Millisecond, fleet)
	rt := p.Router()
	// The others' requests; not the engine's KV figure (External.Apply).
	run, wait, kv := rt.ExternalLoad(p.cands[first].Slot)
	if run != 3 || wait != 0 || kv != 0 {
		t.Fatalf("external load on the busy replica %d, %d, %d; want 3, 0, 0", run, wait, kv)
	}
	if r, w, _ := rt.ExternalLoad(p.cands[other].Slot); r+w != 0 {
		t.Fatalf("external load on the idle replica: %d", r+w)
	}
	// Not again before the next boundary.
	engines[first].running = 1
	p.ScrapeEngines(1999*time.Millisecond, fleet)
	if r, _, _ := rt.ExternalLoad(p.cands[first].Slot); r != 3 {
		t.Fatalf("scraped again within the interval: running %d", r)
	}
	p.Done(rq(1), first)
	engines[first].running = 3 // ours ended; the other router's three run on
	if got := p.Pick(rq(2), fleet); got != other {
		t.Fatalf("cold request went to the replica with three external requests")
	}
	p.Done(rq(2), other)

	engines[first].running, engines[first].kv = 0, 0
	p.ScrapeEngines(2*time.Second, fleet)
	if r, w, kv := rt.ExternalLoad(p.cands[first].Slot); r+w+kv != 0 {
		t.Fatalf("external load after the others' requests ended: %d, %d, %d", r, w, kv)
	}
	if p.Scrapes() != 2 || p.ExternalSeen() != 3 {
		t.Fatalf("scrapes %d, external seen %d; want 2, 3", p.Scrapes(), p.ExternalSeen())
	}
}

// dealtRamjets is two ramjet instances in front of one fleet, requests
// dealt in turn, each with its own view of the in-flight counts: the
// shape of issue 13's multi-router run, enough to check what each
// instance's scrapes find.
type dealtRamjets struct {
	t     *testing.T
	inst  [2]*Ramjet
	views [2][]*Replica
	owner map[int]int
	next  int
	// checked counts scrapes where an instance's external load was
	// compared with the other's reservations.
	checked int
}

func (d *dealtRamjets) Name() string { return "ramjet x2" }

func (d *dealtRamjets) view(k int, fleet []*Replica) []*Replica {
	for len(d.views[k]) < len(fleet) {
		f := fleet[len(d.views[k])]
		d.views[k] = append(d.views[k], &Replica{ID: f.ID, Speculative: f.Speculative, KVCapacity: f.KVCapacity, eng: f.eng})
	}
	return d.views[k]
}

func (d *dealtRamjets) Pick(r *Request, fleet []*Replica) int {
	k := d.next % 2
	d.next++
	d.owner[r.Row.ID] = k
	return d.inst[k].Pick(r, d.view(k, fleet))
}

func (d *dealtRamjets) Routed(r *Request, rep int) {
	d.views[d.owner[r.Row.ID]][rep].InFlight++
	d.inst[d.owner[r.Row.ID]].Routed(r, rep)
}

func (d *dealtRamjets) FirstToken(r *Request, rep int) { d.inst[d.owner[r.Row.ID]].FirstToken(r, rep) }

func (d *dealtRamjets) Done(r *Request, rep int) {
	k := d.owner[r.Row.ID]
	delete(d.owner, r.Row.ID)
	d.inst[k].Done(r, rep)
}

// ScrapeEngines scrapes for both instances. Every request an engine holds
// was reserved by one of them, so each instance's external requests on a
// replica are exactly the other's reservations there.
func (d *dealtRamjets) ScrapeEngines(now time.Duration, fleet []*Replica) {
	for k, p := range d.inst {
		before := p.Scrapes()
		p.ScrapeEngines(now, d.view(k, fleet))
		if p.Scrapes() == before {
			continue
		}
		o := d.inst[1-k]
		for i := range fleet {
			if i >= len(o.cands) {
				continue
			}
			r, w, _ := p.Router().ExternalLoad(p.cands[i].Slot)
			theirs, _ := o.Router().Load(o.cands[i].Slot)
			if r+w != theirs {
				d.t.Fatalf("at %v instance %d sees %d external requests on replica %d, the other holds %d", now, k, r+w, i, theirs)
			}
			d.checked++
		}
	}
}

func TestEngineLoadTwoInstancesSeeEachOther(t *testing.T) {
	w := generate(t, "agent-fleet", workload.Options{Seed: 1, Scale: 0.1})
	d := &dealtRamjets{t: t, owner: map[int]int{}}
	for k := range d.inst {
		p, err := NewRamjetVariant(selection.Config{}, RamjetSetup{EngineLoad: 250 * time.Millisecond}, "ramjet-el")
		if err != nil {
			t.Fatal(err)
		}
		d.inst[k] = p
	}
	if _, err := Run(Config{Workload: w, Replicas: 8, Policy: d, Salt: 1}); err != nil {
		t.Fatal(err)
	}
	if d.checked < 100 {
		t.Fatalf("%d replica scrapes compared", d.checked)
	}
	for k, p := range d.inst {
		if p.ExternalSeen() == 0 {
			t.Fatalf("instance %d never saw the other's requests", k)
		}
	}
}

// ramjet@eo reads the engines' KV usage in the overflow term: the scrapes
// hand every replica's usage to the router (SetEngineKV), and without a
// scrape (el=0) the variant is the rule, decision for decision.
func TestEngineOverflowVariant(t *testing.T) {
	w := generate(t, "agent-fleet", workload.Options{Seed: 1, Scale: 0.1})
	plain := runOne(t, w, "ramjet", 8, 1)
	unscraped := runOne(t, w, "ramjet@eo+el=0", 8, 1)
	if diff := cmp.Diff(plain.Records, unscraped.Records); diff != "" {
		t.Fatalf("eo without scrapes changed the run (-rule +eo):\n%s", diff)
	}
	p, err := NewPolicy("ramjet@eo+el=0.25", 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(Config{Workload: w, Replicas: 8, Policy: p, Salt: 1}); err != nil {
		t.Fatal(err)
	}
	rj := p.(*Ramjet)
	if !rj.rt.Options().EngineOverflow {
		t.Fatal("ramjet@eo: EngineOverflow off")
	}
	for i := range rj.cands {
		if _, ok := rj.rt.EngineKV(rj.cands[i].Slot); !ok {
			t.Fatalf("replica %d: no engine KV figure after %d scrapes", i, rj.Scrapes())
		}
	}
}
