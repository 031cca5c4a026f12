package module

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/fleetstate"
)

// TestPanicRoutingAllPassiveOut: both engines answered 500 (the shipped
// directive retries it on the other), and with max_fails 1 Caddy's passive
// health holds both out for fail_duration (5m) although they serve again
// and pass the active checks. ramjet then routes among the replicas out
// only for their recent failures (reason panic) instead of answering 503
// for five minutes; without it every request here fails. A dead engine
// among them costs a retry, not a failed request; with every engine dead
// the client still gets a fast OpenAI-shaped 5xx.
func TestPanicRoutingAllPassiveOut(t *testing.T) {
	ss := startSims(t, 2, enginesim.Options{})
	for _, s := range ss {
		if err := s.SetFaults(enginesim.Faults{ErrorRate: 1}); err != nil {
			t.Fatal(err)
		}
	}
	c := startCaddyfile(t, directiveCaddyfile(ss.dials(), "\t\tfail_duration 5m\n\t\tmax_fails 1\n\t\tunhealthy_status 5xx"))
	health := func() fleetstate.HealthReport {
		_, rep, _ := readHealth(t, c.url("/health"))
		return rep
	}
	allPassive := func() bool {
		rep := health()
		for _, r := range rep.Replicas {
			if r.Healthy || r.Reason != "passive_failures" {
				return false
			}
		}
		return rep.Healthy == 0 && len(rep.Replicas) == 2
	}
	// Failing answers until Caddy holds both engines out by passive health.
	if !poll(30*time.Second, func() bool {
		if allPassive() {
			return true
		}
		c.chat(chatBody("qwen3-8b", false, [2]string{"user", "fail"}))
		return false
	}) {
		t.Fatalf("engines not held out by passive health: %+v", health())
	}
	for _, s := range ss {
		if err := s.SetFaults(enginesim.Faults{}); err != nil {
			t.Fatal(err)
		}
	}
	m := processMetrics()
	panics := func() (n float64) {
		for _, s := range ss {
			n += seriesValue(m, "routing_decisions_total", "upstream", lookupFleet("").RouteID(s.Addr()), "reason", "panic")
		}
		return n
	}
	before := panics()
	for i := range 4 {
		resp, body := c.chat(chatBody("qwen3-8b", false, [2]string{"user", "after the blip " + string(rune('a'+i))}))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d with every engine passively out: %d %s (health %+v)", i, resp.StatusCode, body, health())
		}
	}
	if d := panics() - before; d < 4 {
		t.Errorf("routing_decisions_total{reason=panic} rose by %v, want >= 4", d)
	}
	if rep := health(); rep.Healthy != 0 || rep.Status != fleetstate.StatusDegraded || !rep.Panic {
		t.Errorf("health %+v: want both held out by Caddy (fail_duration 5m), status degraded, panic", rep)
	}
	// One engine dies while both are held out: its dial fails fast and the
	// attempt is retried on the other, so no request fails.
	ss[0].Close()
	for i := range 6 {
		resp, body := c.chat(chatBody("qwen3-8b", false, [2]string{"user", "one engine gone " + string(rune('a'+i))}))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d with one engine dead and the other passively out: %d %s (health %+v)", i, resp.StatusCode, body, health())
		}
	}
	// Both dead: a fast, OpenAI-shaped 5xx, as without panic routing.
	ss[1].Close()
	start := time.Now()
	resp, body := c.chat(chatBody("qwen3-8b", false, [2]string{"user", "every engine gone"}))
	if resp.StatusCode < 500 || !strings.Contains(string(body), `"error"`) || time.Since(start) > 10*time.Second {
		t.Fatalf("every engine dead: %d %s after %v", resp.StatusCode, body, time.Since(start))
	}
	t.Logf("every engine dead: %d %s after %v", resp.StatusCode, body, time.Since(start))
}
