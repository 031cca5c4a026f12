package module

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// Issue 13: "a scrape that stalls or returns garbage changes nothing but
// the metric and the fallback". Four engines whose /metrics never answer
// well (two stall, two return garbage) behind ramjet with engine_metrics,
// then the same engines behind ramjet without engine_metrics (a fresh
// state_key: an empty index; the engines' caches emptied): the same sequence of requests, with two
// long streams held open (this instance's own reservations) while it
// runs, is placed on the same engines, request for request; only the
// scrape results and the fallback gauge tell the two apart.
func TestEngineMetricsFailingScrapeRoutesAsWithout(t *testing.T) {
	ss := startSims(t, 4, enginesim.Options{TimeScale: 1})
	stop := make(chan struct{})
	defer close(stop)
	stall := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}
	garbage := func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running{ 3\n<html>\n"))
	}
	ups := []string{metricsFront(t, ss[0], stall), metricsFront(t, ss[1], garbage),
		metricsFront(t, ss[2], stall), metricsFront(t, ss[3], garbage)}
	engineOf := map[string]int{}
	for i, u := range ups {
		engineOf[u] = i
	}

	// Three long shared system prompts, six conversations of three turns,
	// interleaved; two long streams opened first hold load on their engines.
	sys := []string{longText("alpha system", 12000), longText("beta system", 9000), longText("gamma system", 6000)}
	var seq []string
	for turn := range 3 {
		for conv := range 6 {
			msgs := [][2]string{{"system", sys[conv%3]}}
			for k := 0; k <= turn; k++ {
				msgs = append(msgs, [2]string{"user", fmt.Sprintf("conversation %d turn %d: %s", conv, k, longText(fmt.Sprint("q", conv, k), 400))})
				if k < turn {
					msgs = append(msgs, [2]string{"assistant", fmt.Sprintf("answer %d of conversation %d", k, conv)})
				}
			}
			seq = append(seq, chatBody("qwen3-8b", false, msgs...))
		}
	}

	run := func(c *obsCaddy, key string, afterHeld func()) []int {
		t.Helper()
		f := lookupFleet(key)
		if f == nil {
			t.Fatalf("no fleet %q", key)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var held []int
		for i := range 2 {
			body := `{"model":"qwen3-8b","stream":true,"max_tokens":30000,"messages":[{"role":"user","content":"` + longText(fmt.Sprint("held", i), 3000) + `"}]}`
			hreq, _ := http.NewRequestWithContext(ctx, "POST", c.url("/v1/chat/completions"), strings.NewReader(body))
			hreq.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(hreq)
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("held stream %d: %v %v", i, err, res)
			}
			// The first chunk: the stream's prefill is done.
			buf := make([]byte, 1)
			if _, err := io.ReadFull(res.Body, buf); err != nil {
				t.Fatalf("held stream %d: %v", i, err)
			}
			go func() { _, _ = io.Copy(io.Discard, res.Body); res.Body.Close() }()
			held = append(held, -1)
			for _, u := range ups {
				if f.RouteID(u) == res.Header.Get(HeaderUpstream) {
					held[i] = engineOf[u]
				}
			}
		}
		afterHeld()
		got := held
		for i, b := range seq {
			resp, body := c.chat(b)
			if resp.StatusCode != 200 {
				t.Fatalf("%s request %d: %s: %s", key, i, resp.Status, body)
			}
			e := -1
			for _, u := range ups {
				if f.RouteID(u) == resp.Header.Get(HeaderUpstream) {
					e = engineOf[u]
				}
			}
			got = append(got, e)
		}
		return got
	}

	with := obsOpts{Policy: map[string]any{"state_key": "scrapefail",
		"engine_metrics": map[string]any{"interval": "50ms", "timeout": "100ms", "stale_after": 1}}}
	c := startObsCaddy(t, ups, with)
	// The scrapes start with the policy's pool, at its first request.
	withScrapes := run(c, "scrapefail", func() {
		eventually(t, "every replica's scrape failed", func() bool {
			n := 0
			for _, e := range c.fleetState().Engines {
				if e.State == "stale" && !e.External.Fresh && e.ConsecutiveFailures > 0 {
					n++
				}
			}
			return n == 4
		})
	})
	_, m := c.do("GET", "http://"+c.ops+"/metrics", "")
	if want := `ramjet_engine_fallback_replicas{fleet="scrapefail"} 4`; !strings.Contains(string(m), want) {
		t.Errorf("metrics lack %s", want)
	}
	for _, res := range []string{"timeout", "parse"} {
		re := regexp.MustCompile(`ramjet_engine_scrapes_total\{fleet="scrapefail",result="` + res + `"\} ([0-9]+)`)
		if mm := re.FindStringSubmatch(string(m)); mm == nil || mm[1] == "0" {
			t.Errorf("no %s scrapes counted: %v", res, mm)
		}
	}

	// The engines forget the first pass (its held streams ended, their
	// prefix caches emptied): an answer with a prefix cached that this
	// instance never sent would read as another instance's placement.
	eventually(t, "the held streams ended", func() bool { return ss.busy() == 0 })
	for _, sim := range ss {
		sim.ResetPrefixCache()
	}
	c.reload(obsOpts{Policy: map[string]any{"state_key": "noscrape"}})
	without := run(c, "noscrape", func() {})
	t.Logf("placements (2 held streams, then %d requests): with failing scrapes %v, without engine_metrics %v", len(seq), withScrapes, without)
	if fmt.Sprint(withScrapes) != fmt.Sprint(without) {
		t.Fatalf("failing scrapes changed the placements:\nwith    %v\nwithout %v", withScrapes, without)
	}
	used := map[int]bool{}
	for _, e := range without {
		if e < 0 {
			t.Fatalf("a request's upstream not found: %v", without)
		}
		used[e] = true
	}
	if len(used) < 3 {
		t.Errorf("the sequence used %d engines (%v): too few to tell placements apart", len(used), without)
	}
}
