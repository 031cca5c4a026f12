package module

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// Issue 13's burst through real HTTP: four ramjet instances (four Caddy
// servers in one process, each its own state_key: its own index and
// reservations, the ids ramjet-0..3 as a StatefulSet's pods give) in front
// of the same 8 simulated engines, no traffic between them. A burst of 12
// requests sharing a 32 KiB prompt, dealt to the instances in turn and all
// in flight together, reaches at least 7 of the 8 engines (the fleet
// simulation's TestMultiBurstFourInstances, 8 of 8 there); with one
// shared spill order (every instance at position 0) it piles onto a few.
func TestE2EBurstSpreadsOverFourInstances(t *testing.T) {
	// Real time: a 32 KiB prompt takes the simulated engine about a second
	// to prefill, so the 12 requests are all in flight together.
	ss := startSims(t, 8, enginesim.Options{TimeScale: 1})
	const n, burst = 4, 12
	sys := longText("burst prefix", 32768)
	// run loads four servers whose policies have the given instance ids (and
	// state keys named by tag), sends the burst and returns the requests each
	// engine received.
	run := func(tag string, ids [n]string) []int {
		t.Helper()
		insts := make([]*testCaddy, n)
		var cfg map[string]any
		servers := map[string]any{}
		for i := range insts {
			c := &testCaddy{t: t, client: listenLocal(t), ups: ss.dials()}
			if i == 0 {
				c.admin = listenLocal(t)
			}
			insts[i] = c
			var one map[string]any
			if err := json.Unmarshal(c.config(proxyOpts{Policy: map[string]any{
				"state_key": fmt.Sprintf("%s%d", tag, i), "instance_id": ids[i]}}), &one); err != nil {
				t.Fatal(err)
			}
			servers[fmt.Sprintf("ramjet%d", i)] = one["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["ramjet"]
			if i == 0 {
				cfg = one
			}
		}
		cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"] = servers
		b, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		insts[0].load(b)
		before := ss.requests()
		var wg sync.WaitGroup
		status := make([]int, burst)
		for i := range burst {
			wg.Go(func() {
				resp, _ := insts[i%n].chat(chatBody("qwen3-8b", false, [2]string{"system", sys}, [2]string{"user", fmt.Sprint("task ", i)}))
				status[i] = resp.StatusCode
			})
		}
		wg.Wait()
		for i, s := range status {
			if s != 200 {
				t.Fatalf("%s: request %d: status %d", tag, i, s)
			}
		}
		got := ss.requests()
		for i := range got {
			got[i] -= before[i]
		}
		if sum(got) != burst {
			t.Fatalf("%s: engines received %v requests, want %d in all", tag, got, burst)
		}
		return got
	}
	usedOf := func(got []int) int {
		used := 0
		for _, r := range got {
			if r > 0 {
				used++
			}
		}
		return used
	}

	got := run("burst", [n]string{"ramjet-0", "ramjet-1", "ramjet-2", "ramjet-3"})
	t.Logf("12-request same-prefix burst over 4 instances: %d of 8 engines, per engine %v", usedOf(got), got)
	if used := usedOf(got); used < 7 {
		t.Fatalf("burst over 4 instances landed on %d of 8 engines (%v), want >= 7", used, got)
	}

	// The control: one shared spill order (every instance at position 0,
	// the rule before instance ids) piles the burst onto a few engines. The
	// engines forget the first burst first (its prefix would be warm on all).
	for _, sim := range ss {
		sim.ResetPrefixCache()
	}
	got = run("same", [n]string{"ramjet-0", "ramjet-0", "ramjet-0", "ramjet-0"})
	t.Logf("the same with one spill order: %d of 8 engines, per engine %v", usedOf(got), got)
	if used := usedOf(got); used > 4 {
		t.Errorf("one shared spill order: burst over %d of 8 engines (%v); the pile-up the ids fix is gone, re-check the test", used, got)
	}
}
