package module

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/fleetstate"
)

func (c *obsCaddy) explain(body string) fleetstate.Explanation {
	c.t.Helper()
	resp, b := c.do(http.MethodPost, "http://"+c.admin+"/ramjet/explain", body)
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("explain: %s: %s", resp.Status, b)
	}
	var ex fleetstate.Explanation
	if err := json.Unmarshal(b, &ex); err != nil {
		c.t.Fatalf("explain: %v: %s", err, b)
	}
	return ex
}

func (c *obsCaddy) fleetState() fleetstate.State {
	c.t.Helper()
	resp, b := c.do(http.MethodGet, "http://"+c.admin+"/ramjet/fleet", "")
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("fleet: %s: %s", resp.Status, b)
	}
	if strings.Contains(string(b), "127.0.0.1") {
		c.t.Fatalf("fleet state leaks an address: %s", b)
	}
	var out struct{ Fleets []fleetstate.State }
	if err := json.Unmarshal(b, &out); err != nil {
		c.t.Fatalf("fleet: %v: %s", err, b)
	}
	if len(out.Fleets) != 1 {
		c.t.Fatalf("fleet: %d fleets, want 1: %s", len(out.Fleets), b)
	}
	return out.Fleets[0]
}

// waitIdle waits until no reservation is left (the handler releases just
// after the response went out).
func (c *obsCaddy) waitIdle(t *testing.T) {
	t.Helper()
	obsEventually(t, "no request in flight", func() bool {
		for _, r := range c.fleetState().Replicas {
			if r.Inflight != 0 || r.PendingPrefill != 0 {
				return false
			}
		}
		return true
	})
}

// TestExplainMatchesPolicy asks explain about a body, then sends the same
// body through Caddy: the policy must choose what explain said, for a
// cold placement, affinity and a load override.
func TestExplainMatchesPolicy(t *testing.T) {
	es := startObsEngines(t, 3, 0, 0)
	// request_cost 2048: one held request outweighs turn 2's 704 tokens of
	// overlap, so that turn 2 is a load override.
	c := startObsCaddy(t, obsDials(es), obsOpts{Policy: map[string]any{"request_cost": 2048}})
	// The fleet learns its pool on the first request.
	obsExchange(t, c, obsChat("m", false, obsText("warmup", 500), "hi"), 200)
	c.waitIdle(t)
	if n := len(c.fleetState().Replicas); n != 3 {
		t.Fatalf("fleet has %d replicas, want 3", n)
	}

	check := func(step, body, wantReason string) (string, fleetstate.Explanation) {
		t.Helper()
		ex := c.explain(body)
		if again := c.explain(body); again.Decision != ex.Decision {
			t.Fatalf("%s: explain changed state: %+v then %+v", step, ex.Decision, again.Decision)
		}
		if ex.Decision.Reason != wantReason {
			t.Errorf("%s: explain reason %q, want %q: %+v", step, ex.Decision.Reason, wantReason, ex)
		}
		id, _ := obsExchange(t, c, body, 200)
		if id != ex.Decision.Upstream {
			t.Fatalf("%s: policy chose %s, explain said %s: %+v", step, id, ex.Decision.Upstream, ex)
		}
		chosen := 0
		for _, r := range ex.Replicas {
			if r.Chosen {
				chosen++
				if r.Upstream != id || r.Score == nil || *r.Score != ex.Decision.Score {
					t.Errorf("%s: chosen replica %+v does not match the decision %+v", step, r, ex.Decision)
				}
			}
			if r.Usable && r.CappedOverlap != min(r.Overlap, ex.AffinityCap) {
				t.Errorf("%s: capped overlap %d of overlap %d", step, r.CappedOverlap, r.Overlap)
			}
		}
		if chosen != 1 {
			t.Errorf("%s: %d replicas marked chosen", step, chosen)
		}
		return id, ex
	}

	sys := obsText("system", 3000)
	t1 := obsChat("m", false, sys, "q1")
	idA, _ := check("turn 1", t1, "cold")
	c.waitIdle(t)

	// Hold a stream of the same prefix on A: its reservation is load.
	holdBody := obsChat("m", true, sys, "q1")
	ex := c.explain(holdBody)
	if ex.Decision.Upstream != idA || ex.Decision.Reason != "affinity" {
		t.Fatalf("held request: explain %+v, want affinity to %s", ex.Decision, idA)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+c.client+"/v1/chat/completions", strings.NewReader(holdBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Obs-Hold", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got := resp.Header.Get(HeaderUpstream); got != idA {
		t.Fatalf("held request went to %s, explain said %s", got, idA)
	}
	one := make([]byte, 1)
	if _, err := resp.Body.Read(one); err != nil {
		t.Fatalf("reading the held stream: %v", err)
	}

	// Turn 2 overlaps A, but A carries the held request: load overrides.
	t2 := obsChat("m", false, sys, "q1", "a1", "q2")
	idB, ex2 := check("turn 2 under load", t2, "load_override")
	if idB == idA {
		t.Fatalf("turn 2 stayed on the loaded replica %s", idA)
	}
	for _, r := range ex2.Replicas {
		if r.Upstream == idA && (r.Inflight != 1 || r.Load <= 0) {
			t.Errorf("loaded replica in explain: %+v", r)
		}
	}

	// Release the hold; turn 3 extends turn 2, which only B holds.
	held, _ := strconv.Atoi(resp.Header.Get("X-Obs-Engine"))
	es[held].release <- struct{}{}
	resp.Body.Close()
	c.waitIdle(t)
	t3 := obsChat("m", false, sys, "q1", "a1", "q2", "a2", "q3")
	if id, _ := check("turn 3", t3, "affinity"); id != idB {
		t.Errorf("turn 3 went to %s, turn 2 to %s", id, idB)
	}
}

// TestAdminFleet checks GET /ramjet/fleet against the ids the policy sets
// and the index.
func TestAdminFleet(t *testing.T) {
	es := startObsEngines(t, 2, 0, 0)
	c := startObsCaddy(t, obsDials(es), obsOpts{})
	ids := map[string]bool{}
	for i := range 6 {
		id, _ := obsExchange(t, c, obsChat("m", false, obsText(strings.Repeat("x", i+1), 800), "q"), 200)
		ids[id] = true
	}
	c.waitIdle(t)
	fs := c.fleetState()
	if fs.Fleet != DefaultStateKey {
		t.Errorf("fleet %q, want %q", fs.Fleet, DefaultStateKey)
	}
	if len(fs.Replicas) != 2 {
		t.Fatalf("%d replicas, want 2", len(fs.Replicas))
	}
	for _, r := range fs.Replicas {
		if !r.Known || !r.Available || !r.Healthy || r.Quarantined {
			t.Errorf("replica %+v is not known, healthy and available", r)
		}
		if len(r.ID) != 16 {
			t.Errorf("replica id %q is not an opaque 16-hex id", r.ID)
		}
	}
	for id := range ids {
		found := false
		for _, r := range fs.Replicas {
			found = found || r.ID == id
		}
		if !found {
			t.Errorf("response id %s is not in the fleet", id)
		}
	}
	if fs.Index.Entries <= 0 || fs.Index.Bytes <= 0 || fs.Index.BudgetBytes != fs.Config.IndexBudget || fs.Index.Used <= 0 {
		t.Errorf("index state %+v (budget %d)", fs.Index, fs.Config.IndexBudget)
	}
}

func TestAdminErrors(t *testing.T) {
	es := startObsEngines(t, 1, 0, 0)
	c := startObsCaddy(t, obsDials(es), obsOpts{})
	obsExchange(t, c, obsChat("m", false, "sys", "q"), 200)
	admin := "http://" + c.admin
	tests := []struct {
		name, method, url, body string
		want                    int
	}{
		{name: "explain by GET", method: http.MethodGet, url: "/ramjet/explain", want: http.StatusMethodNotAllowed},
		{name: "unknown fleet", method: http.MethodPost, url: "/ramjet/explain?fleet=nope", body: obsChat("m", false, "s", "q"), want: http.StatusNotFound},
		{name: "malformed body", method: http.MethodPost, url: "/ramjet/explain", body: `{"model":`, want: http.StatusBadRequest},
		{name: "wrong type", method: http.MethodPost, url: "/ramjet/explain", body: `{"model":"m","messages":"x"}`, want: http.StatusBadRequest},
		{name: "not an LLM path", method: http.MethodPost, url: "/ramjet/explain?path=/v1/models", body: obsChat("m", false, "s", "q"), want: http.StatusBadRequest},
		{name: "completions path", method: http.MethodPost, url: "/ramjet/explain?path=/v1/completions", body: `{"model":"m","prompt":"hello there"}`, want: http.StatusOK},
		{name: "fleet by POST", method: http.MethodPost, url: "/ramjet/fleet", want: http.StatusMethodNotAllowed},
		{name: "unknown fleet state", method: http.MethodGet, url: "/ramjet/fleet?fleet=nope", want: http.StatusNotFound},
		{name: "dashboard data", method: http.MethodGet, url: "/ramjet/dashboard/data", want: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, b := c.do(tt.method, admin+tt.url, tt.body)
			if resp.StatusCode != tt.want {
				t.Errorf("%s %s: %s, want %d: %s", tt.method, tt.url, resp.Status, tt.want, b)
			}
		})
	}
}
