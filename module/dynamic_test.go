package module

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
)

// The dynamic-upstream tests run deploy/k8s/base/Caddyfile (reverse_proxy
// with `dynamic srv` and lb_policy ramjet) against a DNS stub on 127.0.0.1
// whose answers change while traffic flows, as a Kubernetes headless
// Service's do when engine pods come and go.

// dnsStub answers SRV queries for one name with a changing set of targets
// (each resolving to 127.0.0.1 by an A query), and A queries for one name.
type dnsStub struct {
	srvName string
	aName   string

	mu      sync.Mutex
	targets map[string]uint16 // SRV target name -> port
	aIPs    []net.IP

	srvQueries atomic.Int64
	addr       string
}

func startDNSStub(t *testing.T, srvName, aName string) *dnsStub {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsStub{srvName: srvName, aName: aName, targets: map[string]uint16{}, addr: pc.LocalAddr().String()}
	srv := &dns.Server{PacketConn: pc, Handler: s}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return s
}

func (s *dnsStub) setTargets(m map[string]uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.targets = m
}

func (s *dnsStub) setA(ips ...net.IP) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aIPs = ips
}

func (s *dnsStub) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	m.Compress = true // many SRV targets must fit the resolver's UDP size
	s.mu.Lock()
	for _, q := range r.Question {
		name := strings.ToLower(q.Name)
		hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 1}
		switch {
		case q.Qtype == dns.TypeSRV && name == s.srvName:
			s.srvQueries.Add(1)
			hdr.Rrtype = dns.TypeSRV
			for target, port := range s.targets {
				m.Answer = append(m.Answer, &dns.SRV{Hdr: hdr, Priority: 0, Weight: 10, Port: port, Target: target})
			}
		case q.Qtype == dns.TypeA && name == s.aName:
			hdr.Rrtype = dns.TypeA
			for _, ip := range s.aIPs {
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: ip})
			}
		case q.Qtype == dns.TypeA && strings.HasSuffix(name, ".engines.test."):
			// Every engine pod name resolves to the one loopback address;
			// the SRV ports tell the engines apart.
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IPv4(127, 0, 0, 1)})
		}
		// AAAA and anything else: NOERROR, no answer.
	}
	s.mu.Unlock()
	_ = w.WriteMsg(m)
}

// startK8sCaddy adapts deploy/k8s/base/Caddyfile with the stub as resolver,
// after edits, and loads it in-process.
func startK8sCaddy(t *testing.T, stub *dnsStub, srvName string, edits ...func(string) string) *testCaddy {
	t.Helper()
	c := &testCaddy{t: t, client: listenLocal(t), admin: listenLocal(t)}
	metrics := listenLocal(t)
	src, err := os.ReadFile("../deploy/k8s/base/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(src), "# resolvers <dns server>"); n != 3 {
		t.Fatalf("deploy/k8s/base/Caddyfile has %d resolver slots, want 3 (SRV lookup, dial, kv_events)", n)
	}
	cf := string(src)
	for _, e := range edits {
		cf = e(cf)
	}
	cf = strings.ReplaceAll(cf, "# resolvers <dns server>", "resolvers "+stub.addr)
	t.Setenv("RJ_ENGINES_SRV", srvName)
	t.Setenv("RJ_DNS_REFRESH", "100ms")
	t.Setenv("RJ_LISTEN", c.client)
	t.Setenv("RJ_METRICS_LISTEN", metrics)
	t.Setenv("RJ_ADMIN_LISTEN", c.admin)
	setListenPorts(t)
	cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), map[string]any{"filename": "deploy/k8s/base/Caddyfile"})
	if err != nil {
		t.Fatalf("adapting deploy/k8s/base/Caddyfile: %v", err)
	}
	for _, w := range warn {
		t.Logf("adapt warning: %s", w)
	}
	if cfg, err = handOver(cfg, c.client, metrics, c.admin); err != nil {
		t.Fatal(err)
	}
	c.load(cfg)
	return c
}

// serveEngines answers the SRV name with engines ss[i] of idx, each under
// names[i] at its port.
func (s *dnsStub) serveEngines(t *testing.T, names []string, ss sims, idx ...int) {
	t.Helper()
	m := map[string]uint16{}
	for _, i := range idx {
		m[names[i]] = srvPort(t, ss[i])
	}
	s.setTargets(m)
}

func srvPort(t *testing.T, s *enginesim.Server) uint16 {
	t.Helper()
	_, p, err := net.SplitHostPort(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var port uint16
	if _, err := fmt.Sscan(p, &port); err != nil {
		t.Fatal(err)
	}
	return port
}

// TestDynamicSRVReplicasComeAndGo: the ramjet policy over `dynamic srv`
// upstreams keeps a conversation on its replica across DNS refreshes,
// starts using a replica that appears, stops using one that leaves the
// answer, and survives one that stops accepting connections while still
// listed, with no failed request.
func TestDynamicSRVReplicasComeAndGo(t *testing.T) {
	const srvName = "_http._tcp.engines.test."
	ss := startSims(t, 4, enginesim.Options{})
	names := []string{"e0.engines.test.", "e1.engines.test.", "e2.engines.test.", "e3.engines.test."}
	key := func(i int) string { return fmt.Sprintf("%s:%d", names[i], srvPort(t, ss[i])) }
	stub := startDNSStub(t, srvName, "")
	set := func(idx ...int) { stub.serveEngines(t, names, ss, idx...) }
	set(0, 1, 2)
	c := startK8sCaddy(t, stub, srvName)
	cl := newClient(c)

	// /health answers for the pod itself.
	resp, err := http.Get(c.url("/health"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/health: %s", resp.Status)
	}

	engineOf := func(routeID string) int {
		f := lookupFleet("")
		for i := range ss {
			if f != nil && f.RouteID(key(i)) == routeID {
				return i
			}
		}
		return -1
	}

	// A conversation stays on its replica across refreshes (the view is
	// rebuilt from fresh Upstream values on every refresh).
	// About 10k tokens: far more warm overlap than the load of a stray
	// in-flight request (request_cost 512), so only a lost replica
	// identity could move the conversation.
	sys := systemMsg(strings.Repeat("dynamic upstreams keep the prefix warm on one pod. ", 800))
	first := chat(t, cl, nil, []openai.ChatCompletionMessageParamUnion{sys, userMsg("turn one")})
	home := engineOf(first.routeID)
	if home < 0 || home > 2 {
		t.Fatalf("first turn on %q (engine %d), want one of the three listed", first.routeID, home)
	}
	for turn := 0; turn < 3; turn++ {
		q := stub.srvQueries.Load()
		eventually(t, "an SRV refresh", func() bool {
			// Refreshes happen on requests after the 100ms refresh interval.
			r, err := http.Post(c.url("/v1/chat/completions"), "application/json", strings.NewReader(`{"model":"qwen3-8b","messages":[{"role":"user","content":"tick"}],"max_tokens":1}`))
			if err == nil {
				r.Body.Close()
			}
			return stub.srvQueries.Load() > q
		})
		r := chat(t, cl, nil, []openai.ChatCompletionMessageParamUnion{sys, userMsg("turn one"), openai.AssistantMessage(first.text), userMsg(fmt.Sprintf("turn %d", turn+2))})
		if got := engineOf(r.routeID); got != home || r.cached == 0 {
			t.Fatalf("turn %d after a refresh on engine %d (cached %d), want engine %d with a warm prefix", turn+2, got, r.cached, home)
		}
	}

	// Background traffic: distinct prompts, two at a time; every failure
	// is counted.
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 20000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
					Model:     "qwen3-8b",
					Messages:  []openai.ChatCompletionMessageParamUnion{userMsg(fmt.Sprintf("worker %d request %d %s", w, i, strings.Repeat("x ", 200)))},
					MaxTokens: openai.Int(2),
				}, option.WithRequestTimeout(20*time.Second))
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}(w)
	}
	stopped := false
	stopTraffic := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopTraffic()
	waitSent := func(what string, n int64) {
		t.Helper()
		mark := sent.Load()
		deadline := time.Now().Add(30 * time.Second)
		for sent.Load() < mark+n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: only %d of %d requests in 30s", what, sent.Load()-mark, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitSent("warm-up", 20)

	// A replica appears: it gets traffic.
	set(0, 1, 2, 3)
	eventually(t, "the new replica e3 receives requests", func() bool { return ss.requests()[3] > 0 })

	// A replica leaves the answer (its pod is terminating): once the
	// refresh is seen it receives nothing new, then it stops.
	set(1, 2, 3)
	q := stub.srvQueries.Load()
	eventually(t, "the refresh without e0", func() bool { return stub.srvQueries.Load() > q })
	waitSent("after e0 left", 10) // requests already picked may still reach it
	before := ss.requests()[0]
	waitSent("e0 gone", 60)
	if after := ss.requests()[0]; after != before {
		t.Errorf("e0 received %d requests after it left the SRV answer", after-before)
	}
	ss[0].Close()

	// A listed replica stops accepting connections (crashed pod still in
	// DNS): dial failures are retried on another replica.
	if err := ss[1].SetFaults(enginesim.Faults{RefuseConnections: true}); err != nil {
		t.Fatal(err)
	}
	waitSent("while e1 refuses connections", 60)
	set(2, 3)
	waitSent("after e1 left", 30)

	stopTraffic()
	t.Logf("%d requests while replicas came and went, %d failed; per engine %v", sent.Load(), failed.Load(), ss.requests())
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d requests failed; first: %v", n, sent.Load(), firstErr.Load())
	}
	req := ss.requests()
	if req[2] == 0 || req[3] == 0 {
		t.Errorf("remaining replicas got %v", req)
	}
}

// TestDynamicAUpstreams: `dynamic a` (one A record per engine pod IP, as a
// headless Service gives) routed by the ramjet policy: the replica is keyed
// by its resolved address, and a conversation finds its warm prefix. (One
// engine only: tests use 127.0.0.1 alone, and A records carry no port.)
func TestDynamicAUpstreams(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{})
	stub := startDNSStub(t, "", "engine.a.test.")
	stub.setA(net.IPv4(127, 0, 0, 1))
	c := &testCaddy{t: t, client: listenLocal(t), admin: listenLocal(t)}
	cf := fmt.Sprintf(`{
	admin %s
}
http://%s {
	ramjet_observe
	reverse_proxy {
		dynamic a engine.a.test. %d {
			refresh 100ms
			resolvers %s
			versions ipv4
		}
		lb_policy ramjet
		lb_retries 2
		lb_retry_match {
			path *
		}
	}
}`, c.admin, c.client, srvPort(t, ss[0]), stub.addr)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err = handOver(cfg, c.client, c.admin); err != nil {
		t.Fatal(err)
	}
	c.load(cfg)
	cl := newClient(c)
	sys := systemMsg(strings.Repeat("one engine behind an A record. ", 100))
	r1 := chat(t, cl, nil, []openai.ChatCompletionMessageParamUnion{sys, userMsg("one")})
	r2 := chat(t, cl, nil, []openai.ChatCompletionMessageParamUnion{sys, userMsg("one"), openai.AssistantMessage(r1.text), userMsg("two")})
	if r1.routeID != r2.routeID || r2.cached == 0 {
		t.Fatalf("turns on %s then %s, cached %d", r1.routeID, r2.routeID, r2.cached)
	}
	if f := lookupFleet(""); f == nil || f.RouteID(ss[0].Addr()) != r1.routeID {
		t.Fatalf("route id %s is not the engine's %s", r1.routeID, ss[0].Addr())
	}
	if got := ss.requests()[0]; got != 2 {
		t.Fatalf("engine received %d requests, want 2", got)
	}
}

// TestDynamicChurnPastMaxReplicas: a `dynamic srv` fleet of 16 whose pods
// are all replaced, generation after generation, by pods with new
// addresses, until more distinct addresses than selection.MaxReplicas were
// seen: every request is still routed by the ramjet rule (it carries
// X-Ramjet-Upstream) and succeeds, because replicas that left the answer
// are forgotten after depart_after and their slots reused. In the end only
// the last generation is registered, /ramjet/fleet lists only it, and
// ramjet_upstream_departures_total counts every earlier pod.
func TestDynamicChurnPastMaxReplicas(t *testing.T) {
	const (
		perGen = 16
		gens   = selection.MaxReplicas/perGen + 2 // 1056 distinct addresses
	)
	// A name of its own: Caddy caches SRV answers process-wide, across
	// configs, and an earlier test's would name its closed simulators.
	srvName := fmt.Sprintf("_http._tcp.churn%d.engines.test.", time.Now().UnixNano())
	ss := startSims(t, 1, enginesim.Options{})
	port := srvPort(t, ss[0])
	stub := startDNSStub(t, srvName, "")
	// perGen pod names a generation, each generation new (as replaced pods
	// get new addresses); all resolve to the one simulator.
	names := func(g int) []string {
		out := make([]string, perGen)
		for j := range out {
			out[j] = fmt.Sprintf("g%dp%d.engines.test.", g, j)
		}
		return out
	}
	gen := func(g int) {
		m := map[string]uint16{}
		for _, n := range names(g) {
			m[n] = port
		}
		stub.setTargets(m)
	}
	gen(0)
	c := startCaddyfile(t, fmt.Sprintf(`{
	admin {ADMIN}
}
http://{ADDR} {
	reverse_proxy {
		dynamic srv %s {
			refresh 20ms
			resolvers %s
		}
		lb_policy ramjet {
			depart_after 100ms
		}
		transport http {
			resolvers %s
		}
	}
}`, srvName, stub.addr, stub.addr))
	keysOf := func(g int) []string {
		out := names(g)
		for j, n := range out {
			out[j] = fmt.Sprintf("%s:%d", n, port)
		}
		return out
	}
	inGen := func(g int, id string) bool {
		f := lookupFleet("")
		for _, k := range keysOf(g) {
			if f != nil && f.RouteID(k) == id {
				return true
			}
		}
		return false
	}
	for g := 0; g < gens; g++ {
		gen(g)
		// Requests until one lands on the new generation (the pool
		// refreshed); every one must be routed by ramjet and succeed.
		eventually(t, fmt.Sprintf("a request routed to generation %d", g), func() bool {
			resp, err := http.Post(c.url("/v1/chat/completions"), "application/json",
				strings.NewReader(`{"model":"qwen3-8b","messages":[{"role":"user","content":"generation `+fmt.Sprint(g)+`"}],"max_tokens":1}`))
			if err != nil {
				t.Fatalf("generation %d: %v", g, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("generation %d: %s: %s", g, resp.Status, b)
			}
			id := resp.Header.Get(HeaderUpstream)
			if id == "" {
				t.Fatalf("generation %d (%d distinct addresses seen): routed by the fallback policy, not ramjet (no %s)", g, perGen*(g+1), HeaderUpstream)
			}
			return inGen(g, id)
		})
	}
	f := lookupFleet("")
	eventually(t, "only the last generation registered", func() bool { return f.Base().Registered() == perGen })
	if n := f.Base().Len(); n > selection.MaxReplicas/4 {
		t.Errorf("%d slots used for %d addresses, %d at a time: slots are not reused", n, gens*perGen, perGen)
	}
	var want []string
	for _, k := range keysOf(gens - 1) {
		want = append(want, f.RouteID(k))
	}
	sort.Strings(want)
	if diff := cmp.Diff(want, adminFleetIDs(t, c)); diff != "" {
		t.Errorf("/ramjet/fleet replicas (-want +got):\n%s", diff)
	}
	if got, wantN := departures(t, DefaultStateKey), float64((gens-1)*perGen); got != wantN {
		t.Errorf("ramjet_upstream_departures_total = %v, want %v", got, wantN)
	}
}

// adminFleetIDs returns the route ids GET /ramjet/fleet lists for the
// default fleet, sorted.
func adminFleetIDs(t *testing.T, c *testCaddy) []string {
	t.Helper()
	resp, b := c.do(http.MethodGet, "http://"+c.admin+"/ramjet/fleet?fleet="+DefaultStateKey, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /ramjet/fleet: %s: %s", resp.Status, b)
	}
	var out fleetstate.Fleets
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decoding /ramjet/fleet: %v", err)
	}
	if len(out.Fleets) != 1 {
		t.Fatalf("/ramjet/fleet lists %d fleets", len(out.Fleets))
	}
	ids := []string{}
	for _, r := range out.Fleets[0].Replicas {
		ids = append(ids, r.ID)
	}
	sort.Strings(ids)
	return ids
}

// departures reads ramjet_upstream_departures_total of fleet from the
// collector ramjet registers.
func departures(t *testing.T, fleet string) float64 {
	m := collectorMetric(t, departuresCollector(), "ramjet_upstream_departures_total", "fleet", fleet)
	return m.GetCounter().GetValue() // 0 without the series
}

// collectorMetric gathers c and returns the series of family name whose
// labels include the given name/value pairs (nil: none).
func collectorMetric(t *testing.T, c prometheus.Collector, name string, labels ...string) *dto.Metric {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue series
				}
			}
			return m
		}
	}
	return nil
}
