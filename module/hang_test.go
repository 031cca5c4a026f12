package module

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// hungEngineTimeout is the tests' engine_timeout. It must exceed the
// longest stall of the test process itself on a loaded machine: a stall
// past it times out the healthy engines' requests too, and three such
// stalls within fail_duration take every engine out (503s for 30 s; seen
// with 1s beside another `go test ./...`, and reproduced by freezing the
// test process for 1.3 s).
const hungEngineTimeout = 3 * time.Second

// hangBound is the longest a request may take in the hung-engine tests:
// engine_timeout for each of the 3 attempts (lb_retries 2), plus slack
// for a loaded machine.
const hangBound = 3*hungEngineTimeout + 10*time.Second

// hungRun is what the clients of a hung-engine test saw.
type hungRun struct {
	mu      sync.Mutex
	errs    []error
	slowest time.Duration
	// health is /health's answer right after the first failed request (a
	// failure under load is then diagnosable from the log).
	health string
}

// runHungFleet starts 4 engines, the first with faults f, behind
// deploy/Caddyfile with RJ_ENGINE_TIMEOUT=hungEngineTimeout, and 4 clients sending
// requests (each its own prompt) until done returns true (checked between
// requests) or a minute passed.
func runHungFleet(t *testing.T, f enginesim.Faults, stream bool) (*proxy, sims, func(done func(*hungRun) bool) *hungRun) {
	t.Helper()
	ss := startSims(t, 4, enginesim.Options{})
	if err := ss[0].SetFaults(f); err != nil {
		t.Fatal(err)
	}
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":       strings.Join(ss.dials(), ","),
		"RJ_ENGINE_TIMEOUT": hungEngineTimeout.String(),
	})
	c := &http.Client{Timeout: 2 * hangBound}
	t.Cleanup(c.CloseIdleConnections)
	seq := 0
	run := func(done func(*hungRun) bool) *hungRun {
		r := &hungRun{}
		deadline := time.Now().Add(time.Minute)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; !done(r) && time.Now().Before(deadline); k++ {
					prompt := fmt.Sprintf("%s run %d client %d request %d", t.Name(), seq, w, k)
					start := time.Now()
					var err error
					if stream {
						err = streamOnce(context.Background(), c, p.base, ss[0].Model(), prompt)
					} else {
						err = chatOnce(c, p.base, ss[0].Model(), prompt)
					}
					took := time.Since(start)
					r.mu.Lock()
					if err != nil && r.health == "" {
						r.health = "(reading)"
						r.mu.Unlock()
						h := healthSnapshot(c, p.base)
						r.mu.Lock()
						r.health = fmt.Sprintf("after %v: %s", took, h)
					}
					r.errs = append(r.errs, err)
					r.slowest = max(r.slowest, took)
					r.mu.Unlock()
				}
			}()
		}
		wg.Wait()
		seq++
		return r
	}
	return p, ss, run
}

// healthSnapshot is /health's body, or why it could not be read.
func healthSnapshot(c *http.Client, base string) string {
	resp, err := c.Get(base + "/health")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}

// untilEjected is a done condition: one replica ejected (asked of /health
// after every 16th request, to keep the load of the test itself down).
func untilEjected(t *testing.T, p *proxy) func(*hungRun) bool {
	return func(r *hungRun) bool {
		r.mu.Lock()
		n := len(r.errs)
		r.mu.Unlock()
		return n%16 == 0 && ejectedReplicas(t, p) == 1
	}
}

// atLeast is a done condition: n requests sent.
func atLeast(n int) func(*hungRun) bool {
	return func(r *hungRun) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.errs) >= n
	}
}

// chatOnce sends one non-streaming chat request and checks the answer.
func chatOnce(c *http.Client, base, model, prompt string) error {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, model, prompt)
	resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"chat.completion"`) {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode, b)
	}
	return nil
}

// ejectedReplicas counts the replicas /health reports as ejected.
func ejectedReplicas(t *testing.T, p *proxy) int {
	_, h, _ := getHealth(t, p)
	n := 0
	for _, r := range h.Replicas {
		if r.Reason == "ejected" {
			n++
		}
	}
	return n
}

// TestHungEngineBeforeFirstByte: an engine that accepts requests and never
// answers (its model list still does, so active health checks pass) costs
// each request that lands on it at most engine_timeout before the retry
// on another engine; no request fails, none waits past the bound, and
// the engine is ejected after its failures and then gets no more traffic.
// Issue 15, item 9.
func TestHungEngineBeforeFirstByte(t *testing.T) {
	p, ss, run := runHungFleet(t, enginesim.Faults{HangBeforeFirstToken: true}, false)
	// Until the hung engine is ejected (5 consecutive failures, each one
	// engine_timeout long: the load it holds meanwhile keeps traffic off).
	first := run(untilEjected(t, p))
	for k, err := range first.errs {
		if err != nil {
			t.Errorf("until the ejection, request %d: %v", k, err)
		}
	}
	if first.health != "" {
		t.Logf("until the ejection: /health at the first failure %s", first.health)
	}
	if ejectedReplicas(t, p) != 1 {
		t.Fatalf("the hung engine was never ejected; engine attempts %v", ss.requests())
	}
	atEjection := ss.requests()
	r := run(atLeast(100))
	after := ss.requests()
	for k, err := range r.errs {
		if err != nil {
			t.Errorf("after the ejection, request %d: %v", k, err)
		}
	}
	if r.health != "" {
		t.Logf("after the ejection: /health at the first failure %s", r.health)
	}
	for i, res := range []*hungRun{first, r} {
		if res.slowest > hangBound {
			t.Errorf("run %d: slowest request took %v, bound %v", i, res.slowest, hangBound)
		}
	}
	t.Logf("until ejection: %d requests, slowest %v, engine attempts %v; after: %d requests, slowest %v, attempts %v",
		len(first.errs), first.slowest, atEjection, len(r.errs), r.slowest, after)
	// After the ejection only a half-open probe (after the 10s base
	// ejection) may reach it.
	if got := after[0] - atEjection[0]; got > 1 {
		t.Errorf("the ejected engine received %d of the next %d requests", got, len(r.errs))
	}
}

// TestHungEngineMidStream: an engine that stalls streams after two tokens
// (connection open, silent) ends each of them after engine_timeout with an
// SSE error event, not a hang; it is ejected, and every other stream
// completes. Issue 15, item 9.
func TestHungEngineMidStream(t *testing.T) {
	p, ss, run := runHungFleet(t, enginesim.Faults{StallAfterTokens: 2}, true)
	r := run(untilEjected(t, p))
	reqs := ss.requests()
	failed := 0
	for i, err := range r.errs {
		if err == nil {
			continue
		}
		failed++
		if !strings.Contains(err.Error(), "stream error event") {
			t.Errorf("request %d: %v, want an SSE error event", i, err)
		}
	}
	if r.slowest > hangBound {
		t.Errorf("slowest stream took %v, bound %v", r.slowest, hangBound)
	}
	t.Logf("%d streams, %d cut by the engine timeout, slowest %v; engine attempts %v", len(r.errs), failed, r.slowest, reqs)
	if ejectedReplicas(t, p) != 1 {
		t.Fatalf("the stalling engine was never ejected")
	}
	if failed != reqs[0] {
		t.Errorf("%d streams failed, the stalling engine received %d: every stall must end in a failure and nothing else may", failed, reqs[0])
	}
}
