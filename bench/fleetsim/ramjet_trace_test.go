package fleetsim

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// The decision log has one line per decision, one per first token and one
// per engine answer's usage (the prompt and cached tokens Observe is fed),
// stamped with the simulated time the router's clock reads: each decision
// at its request's send time, each first token at the record's.
func TestRamjetDecisionLog(t *testing.T) {
	w := generate(t, "burst", workload.Options{Seed: 1, Scale: 0.25})
	p, err := NewRamjet(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	p.SetTrace(&buf)
	res, err := Run(Config{Workload: w, Replicas: 8, Policy: p, Salt: 1})
	if err != nil {
		t.Fatal(err)
	}
	decided, firsts, observed := 0, 0, 0
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var id int
		var now float64
		if strings.HasPrefix(line, "first ") {
			if _, err := fmt.Sscanf(line, "first id=%d now=%g", &id, &now); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			if got := res.Records[id].First; fmt.Sprintf("%.3f", got) != fmt.Sprintf("%.3f", now) {
				t.Errorf("request %d: first token logged at %.3f, recorded at %.3f", id, now, got)
			}
			firsts++
			continue
		}
		if strings.HasPrefix(line, "obs ") {
			var prompt, cached int
			if _, err := fmt.Sscanf(line, "obs id=%d now=%g prompt=%d cached=%d", &id, &now, &prompt, &cached); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			if rec := res.Records[id]; prompt != rec.Prompt || cached != rec.Cached {
				t.Errorf("request %d: usage logged as prompt %d cached %d, recorded %d / %d", id, prompt, cached, rec.Prompt, rec.Cached)
			}
			observed++
			continue
		}
		if _, err := fmt.Sscanf(line, "id=%d now=%g", &id, &now); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if got := res.Records[id].Sent; fmt.Sprintf("%.3f", got) != fmt.Sprintf("%.3f", now) {
			t.Errorf("request %d: decided at %.3f, sent at %.3f", id, now, got)
		}
		if !strings.Contains(line, fmt.Sprintf("-> %d ", res.Records[id].Replica)) {
			t.Errorf("request %d: log %q does not name replica %d", id, line, res.Records[id].Replica)
		}
		decided++
	}
	if decided != len(w.Trace) || firsts != len(w.Trace) || observed != len(w.Trace) {
		t.Fatalf("%d decision, %d first-token and %d usage lines for %d requests", decided, firsts, observed, len(w.Trace))
	}
}

// Burst rounds are 30 s apart: past the linger TTL, the previous round's
// released context no longer counts, and the rule spreads every round as
// the rule without lingering does; with the TTL off (the rule before) it
// does not.
func TestRamjetBurstLingerExpires(t *testing.T) {
	w := generate(t, "burst", workload.Options{Seed: 4})
	routed := func(name string) []int {
		t.Helper()
		return runOne(t, w, name, 8, 1).Routed
	}
	ttl, none, forever := routed("ramjet"), routed("ramjet@nolinger"), routed("ramjet@lt=-1")
	if fmt.Sprint(ttl) != fmt.Sprint(none) {
		t.Errorf("per-replica requests with the TTL %v, without lingering %v: want equal", ttl, none)
	}
	if fmt.Sprint(forever) == fmt.Sprint(none) {
		t.Errorf("lingering forever routes as no lingering (%v): the test tells nothing", forever)
	}
}
