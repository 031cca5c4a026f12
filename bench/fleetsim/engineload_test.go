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
	// The engine's 20,000 KV tokens less our request's resident context.
	ours := rt.Resident(p.cands[first].Slot)
	if ours <= 0 {
		t.Fatalf("our request's resident tokens %d", ours)
	}
	run, wait, kv := rt.ExternalLoad(p.cands[first].Slot)
	if run != 3 || wait != 0 || kv != 20_000-ours {
		t.Fatalf("external load on the busy replica %d, %d, %d; want 3, 0, %d", run, wait, kv, 20_000-ours)
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
