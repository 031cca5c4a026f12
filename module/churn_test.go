package module

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
)

func TestDepartAfterCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    time.Duration
		wantErr string
	}{
		{name: "set", give: "ramjet {\n depart_after 2m\n}", want: 2 * time.Minute},
		{name: "unset", give: "ramjet", want: 0},
		{name: "twice", give: "ramjet {\n depart_after 1s\n depart_after 2s\n}", wantErr: "more than once"},
		{name: "not a duration", give: "ramjet {\n depart_after soon\n}", wantErr: "not a positive duration"},
		{name: "no value", give: "ramjet {\n depart_after\n}", wantErr: "missing value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s RamjetSelection
			err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(s.DepartAfter); got != tt.want {
				t.Errorf("DepartAfter = %v, want %v", got, tt.want)
			}
		})
	}
}

// churnCaddy is an in-process Caddy whose config is a Caddyfile
// reverse_proxy block body, reloaded through the admin API.
type churnCaddy struct {
	*testCaddy
	stub string // DNS stub address
}

// churnConfig adapts a site proxying with the ramjet policy (depart_after
// 200ms) to upstream, a reverse_proxy block's upstream lines.
func (c *churnCaddy) churnConfig(t *testing.T, upstream string) []byte {
	t.Helper()
	cf := fmt.Sprintf(`{
	admin %s
	servers {
		listener_wrappers {
			ramjet_handover
		}
	}
}
http://%s {
	reverse_proxy {
		%s
		lb_policy ramjet {
			depart_after 200ms
		}
	}
}`, c.admin, c.client, upstream)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err = handOver(cfg, c.client, c.admin); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func staticUps(ss sims, idx ...int) string {
	var b strings.Builder
	b.WriteString("to")
	for _, i := range idx {
		b.WriteString(" " + ss[i].Addr())
	}
	return b.String()
}

func (c *churnCaddy) dynamicA(t *testing.T, s *enginesim.Server) string {
	return fmt.Sprintf("dynamic a engine.a.test. %d {\n\t\t\trefresh 100ms\n\t\t\tresolvers %s\n\t\t\tversions ipv4\n\t\t}", srvPort(t, s), c.stub)
}

// overlapOf is the approximate index's overlap (tokens) of a chat body on
// the replica key, as POST /ramjet/explain reports it; -1 when the fleet
// does not list the key.
func overlapOf(t *testing.T, f *fleet, key, body string) int {
	t.Helper()
	ex, err := fleetstate.Explain(f.Router(), f.snapshot(), selection.EndpointChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	id := f.RouteID(key)
	for _, r := range ex.Replicas {
		if id != "" && r.Upstream == id {
			return r.Overlap
		}
	}
	return -1
}

// TestReloadChangedUpstreamsLosesNoRequest: admin-API reloads that change
// the upstream list (static lists, then `dynamic a` through a DNS stub)
// while traffic flows fail no request; a replica that stays across a
// reload keeps its warm index (even when it moves from a static list to
// `dynamic a`: the key is the dial address); a replica that left is
// forgotten once depart_after passed (not listed by /ramjet/fleet,
// counted by ramjet_upstream_departures_total); one that comes back
// starts cold.
func TestReloadChangedUpstreamsLosesNoRequest(t *testing.T) {
	ss := startSims(t, 3, enginesim.Options{})
	stub := startDNSStub(t, "", "engine.a.test.")
	stub.setA(net.IPv4(127, 0, 0, 1))
	c := &churnCaddy{testCaddy: &testCaddy{t: t, client: listenLocal(t), admin: listenLocal(t)}, stub: stub.addr}
	c.load(c.churnConfig(t, staticUps(ss, 0, 1)))
	key := func(i int) string { return ss[i].Addr() }
	before := departures(t, DefaultStateKey)

	// A prompt the index places on engine 0, to check later that engine 0
	// comes back cold.
	var onZero string
	eventually(t, "a prompt routed to engine 0", func() bool {
		body := chatBody("qwen3-8b", false, [2]string{"user", longText(fmt.Sprint("engine zero ", time.Now().UnixNano()), 2000)})
		resp, _ := c.chat(body)
		if resp.StatusCode != 200 {
			t.Fatalf("chat: %s", resp.Status)
		}
		if ss.byRouteID(resp.Header.Get(HeaderUpstream)) == 0 {
			onZero = body
			return true
		}
		return false
	})
	f := lookupFleet("")
	if overlapOf(t, f, key(0), onZero) <= 0 {
		t.Fatal("engine 0 holds nothing of the prompt routed to it")
	}

	// Background traffic on fresh connections (a reused keep-alive
	// connection of the old config's server is issue 15's, not this
	// test's); every failure is counted.
	var sent, failed, connFailed atomic.Int64
	var firstErr, firstConnErr atomic.Value
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				body := chatBody("qwen3-8b", false, [2]string{"user", fmt.Sprintf("worker %d request %d %s", w, i, strings.Repeat("y ", 100))})
				resp, err := cl.Post(c.url("/v1/chat/completions"), "application/json", strings.NewReader(body))
				sent.Add(1)
				if err != nil {
					// No response at all: the connection closed under the
					// reload (see connFailed below).
					connFailed.Add(1)
					firstConnErr.CompareAndSwap(nil, err.Error())
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Header.Get(HeaderUpstream) == "" {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("status %s, %s %q", resp.Status, HeaderUpstream, resp.Header.Get(HeaderUpstream)))
				}
			}
		}(w)
	}
	defer func() { stop(); wg.Wait() }()
	waitSent := func(what string, n int64) {
		t.Helper()
		mark := sent.Load()
		eventually(t, fmt.Sprintf("%d requests %s", n, what), func() bool { return sent.Load() >= mark+n })
	}
	reload := func(upstream string) {
		t.Helper()
		postLoad(t, c.admin, c.churnConfig(t, upstream))
	}
	// gone waits until the replica keys left the fleet, and checks that
	// /ramjet/fleet lists exactly the ids of want.
	gone := func(left []int, want []int) {
		t.Helper()
		eventually(t, fmt.Sprintf("engines %v forgotten", left), func() bool {
			for _, i := range left {
				if _, ok := f.Base().Lookup(key(i)); ok {
					return false
				}
			}
			return true
		})
		var ids []string
		for _, i := range want {
			ids = append(ids, fleetIDOf(key(i)))
		}
		sort.Strings(ids)
		if got := adminFleetIDs(t, c.testCaddy); strings.Join(got, ",") != strings.Join(ids, ",") {
			t.Errorf("/ramjet/fleet lists %v, want %v (engines %v)", got, ids, want)
		}
	}
	waitSent("before the first reload", 20)

	// {0,1} -> {1,2}: engine 0 leaves, engine 2 joins.
	reload(staticUps(ss, 1, 2))
	eventually(t, "engine 2 receives requests", func() bool { return ss.requests()[2] > 0 })
	gone([]int{0}, []int{1, 2})
	if got := departures(t, DefaultStateKey) - before; got != 1 {
		t.Errorf("%v departures counted after engine 0 left, want 1", got)
	}

	// A conversation on one of {1,2}; the other leaves with the reload to
	// `dynamic a` on the conversation's engine: its index stays warm.
	sys := longText("a conversation that outlives reloads", 8000)
	msgs := [][2]string{{"system", sys}, {"user", "turn one"}}
	resp, _ := c.chat(chatBody("qwen3-8b", false, msgs...))
	home := ss.byRouteID(resp.Header.Get(HeaderUpstream))
	if home != 1 && home != 2 {
		t.Fatalf("conversation on engine %d, want 1 or 2", home)
	}
	other := 3 - home
	reload(c.dynamicA(t, ss[home]))
	gone([]int{other}, []int{home})
	msgs = append(msgs, [2]string{"assistant", "ok"}, [2]string{"user", "turn two"})
	turn2 := chatBody("qwen3-8b", false, msgs...)
	if got := overlapOf(t, f, key(home), turn2); got <= 0 {
		t.Errorf("engine %d's index lost the conversation across the reload to dynamic a (overlap %d)", home, got)
	}
	resp, _ = c.chat(turn2)
	if got := ss.byRouteID(resp.Header.Get(HeaderUpstream)); got != home {
		t.Errorf("turn two on engine %d, want %d", got, home)
	}

	// Engine 0 comes back (dynamic a on its port): registered anew, cold.
	reload(c.dynamicA(t, ss[0]))
	eventually(t, "engine 0 registered again", func() bool { _, ok := f.Base().Lookup(key(0)); return ok })
	if got := overlapOf(t, f, key(0), onZero); got != 0 {
		t.Errorf("engine 0 came back with %d tokens of overlap, want 0 (cold)", got)
	}
	gone([]int{home}, []int{0})
	waitSent("after the last reload", 20)

	stop()
	wg.Wait()
	t.Logf("%d requests across 3 reloads, %d failed, %d without a response; per engine %v", sent.Load(), failed.Load(), connFailed.Load(), ss.requests())
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d requests failed; first: %v", n, sent.Load(), firstErr.Load())
	}
	// No request may go unanswered either. net/http closes unanswered a
	// connection whose request it reads after its Shutdown began (pinned by
	// handover.TestShutdownDropsRequestReadDuringShutdown): the bare test
	// listener lost about one request in 15 runs that way. The config has
	// ramjet_handover, as deploy/Caddyfile does, which replays such a
	// request on the new config's server.
	if n := connFailed.Load(); n != 0 {
		t.Errorf("%d of %d requests got no response (connection closed under a reload); first: %v", n, sent.Load(), firstConnErr.Load())
	}
	if got := departures(t, DefaultStateKey) - before; got != 3 {
		t.Errorf("%v departures counted, want 3", got)
	}
}

// fleetIDOf is the default fleet's route id of a replica key.
func fleetIDOf(key string) string { return lookupFleet("").RouteID(key) }

// TestDepartureWaitsForInflight: a replica dropped by a reload while a
// stream is in flight on it stays registered (its reservation counted)
// past depart_after, and departs once the stream ends.
func TestDepartureWaitsForInflight(t *testing.T) {
	ss := startSims(t, 2, enginesim.Options{})
	if err := ss[0].SetFaults(enginesim.Faults{StallAfterTokens: 3}); err != nil {
		t.Fatal(err)
	}
	c := &churnCaddy{testCaddy: &testCaddy{t: t, client: listenLocal(t), admin: listenLocal(t)}}
	c.load(c.churnConfig(t, staticUps(ss, 0)))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/v1/chat/completions"),
		strings.NewReader(chatBody("qwen3-8b", true, [2]string{"user", "a stream that outlives its replica"})))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %s", resp.Status)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("reading the stream's first line: %v", err)
	}

	postLoad(t, c.admin, c.churnConfig(t, staticUps(ss, 1)))
	// Fresh connections: the old config's server drains (the stream keeps
	// it up) and closes the ones it accepted.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	eventually(t, "a request on the new config", func() bool {
		r, err := fresh.Post(c.url("/v1/chat/completions"), "application/json",
			strings.NewReader(chatBody("qwen3-8b", false, [2]string{"user", "new config"})))
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200 && ss.byRouteID(r.Header.Get(HeaderUpstream)) == 1
	})
	f := lookupFleet("")
	cs := churnOf(f)
	if cs == nil {
		t.Fatal("no departure sweeper for the fleet")
	}
	// Two sweeps that start past depart_after from now.
	past := time.Now().Add(200 * time.Millisecond)
	eventually(t, "depart_after to pass", func() bool { return time.Now().After(past) })
	n := cs.Sweeps()
	eventually(t, "two sweeps past depart_after", func() bool { return cs.Sweeps() >= n+2 })
	if _, ok := f.Base().Lookup(ss[0].Addr()); !ok {
		t.Fatal("engine 0 was forgotten while a stream held a reservation on it")
	}
	if in, _ := f.Base().Load(mustSlot(t, f, ss[0].Addr())); in != 1 {
		t.Errorf("engine 0 holds %d requests, want the stream's 1", in)
	}
	cancel() // the client gives up on the stalled stream: the reservation ends
	eventually(t, "engine 0 forgotten after the stream ended", func() bool {
		_, ok := f.Base().Lookup(ss[0].Addr())
		return !ok
	})
}

func mustSlot(t *testing.T, f *fleet, key string) selection.Slot {
	t.Helper()
	s, ok := f.Base().Lookup(key)
	if !ok {
		t.Fatalf("%s not registered", key)
	}
	return s
}

// churnOf returns the departure sweeper of f, nil when none runs.
func churnOf(f *fleet) *fleetstate.Sweeper[*RamjetSelection] {
	return churns.Get(f)
}
