package kvindex

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

func TestTemplateExpand(t *testing.T) {
	tmpl := FeedSpec{Upstream: "*", Events: "tcp://{upstream.host}:5557", Replay: "tcp://{upstream.host}:{upstream.port+100}"}
	for _, tc := range []struct {
		spec          FeedSpec
		key           string
		events        string
		replay        string
		replica, base string
		rank          string
	}{
		{tmpl, "127.0.0.1:8000", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:8100", "127.0.0.1:8000", "http://127.0.0.1:8000", ""},
		{tmpl, "[::1]:8000", "tcp://[::1]:5557", "tcp://[::1]:8100", "[::1]:8000", "http://[::1]:8000", ""},
		{tmpl, "engine-0.engines.test:8000", "tcp://engine-0.engines.test:5557", "tcp://engine-0.engines.test:8100",
			"engine-0.engines.test:8000", "http://engine-0.engines.test:8000", ""},
		{FeedSpec{Upstream: "*", Events: "tcp://127.0.0.1:{upstream.port+1}", Scheme: "https"}, "127.0.0.1:21000",
			"tcp://127.0.0.1:21001", "", "127.0.0.1:21000", "https://127.0.0.1:21000", ""},
		// Ranks: rank r offsets both ports by r, after the template.
		{FeedSpec{Upstream: "*", Events: "tcp://{upstream.host}:5557", Replay: "tcp://{upstream.host}:5600", Ranks: 2},
			"127.0.0.1:8000#1", "tcp://127.0.0.1:5558", "tcp://127.0.0.1:5601", "127.0.0.1:8000#1", "http://127.0.0.1:8000", "1"},
	} {
		e, err := tc.spec.Expand(tc.key, "kv", "X-Rank")
		if err != nil {
			t.Fatalf("%s: %v", tc.key, err)
		}
		if e.Feed.Events != tc.events || e.Feed.Replay != tc.replay || e.Feed.Replica != tc.replica ||
			e.BaseURL != tc.base || e.Header.Get("X-Rank") != tc.rank || e.Feed.Topic != "kv" || e.Feed.Bind {
			t.Errorf("%s: got %+v", tc.key, e)
		}
	}
	for _, key := range []string{"127.0.0.1:8000#0", "127.0.0.1", "host:port"} {
		if _, err := tmpl.Expand(key, "", ""); err == nil {
			t.Errorf("%s: expanded", key)
		}
	}
	two := FeedSpec{Upstream: "*", Events: "tcp://{upstream.host}:5557", Ranks: 2}
	for _, key := range []string{"127.0.0.1:8000", "127.0.0.1:8000#2", "127.0.0.1:8000#x"} {
		if _, err := two.Expand(key, "", ""); err == nil {
			t.Errorf("ranks 2, %s: expanded", key)
		}
	}
}

func TestTemplateValidate(t *testing.T) {
	for _, tc := range []struct {
		feeds []FeedSpec
		want  string
	}{
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.host}:5557", Bind: true}}, "bind is not supported"},
		// The Caddyfile turns {host} into {http.request.host}.
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{http.request.host}:5557"}}, "write {upstream.host}"},
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.ip}:5557"}}, "unknown placeholder {upstream.ip}"},
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.host}:{upstream.port+x}"}}, "bad port offset"},
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.host}:{upstream.port+65535}"}}, "bad port offset"},
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.host:5557"}}, "unclosed"},
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.host}"}}, "missing port"},
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.host}:5557"}, {Upstream: "*", Events: "tcp://{upstream.host}:5558"}}, "listed twice"},
		{[]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.host}:5557", Scheme: "ftp"}}, "scheme"},
	} {
		err := ValidateFeeds(tc.feeds)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.feeds, err, tc.want)
		}
	}
	ok := []FeedSpec{{Upstream: "127.0.0.1:8009", Events: "tcp://127.0.0.1:5559"},
		{Upstream: "*", Events: "tcp://{upstream.host}:5557", Replay: "tcp://{upstream.host}:5558"}}
	if err := ValidateFeeds(ok); err != nil {
		t.Fatal(err)
	}
	s := Settings{Engines: ok}
	s.SetDefaults()
	pc, err := s.Precise("", "X-Rank", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(pc.Engines) != 1 || pc.Template == nil || pc.Template.Feed.Events != ok[1].Events {
		t.Errorf("precise config: engines %+v, template %+v", pc.Engines, pc.Template)
	}
}

// keyFor is a replica key whose template expansion
// "tcp://{upstream.host}:{upstream.port}" is p's events address.
func keyFor(t *testing.T, p *testPub) string {
	t.Helper()
	hp := strings.TrimPrefix(p.events, "tcp://")
	if _, _, err := net.SplitHostPort(hp); err != nil {
		t.Fatal(err)
	}
	return hp
}

// TestTemplateFeedLifecycle: Bind starts a template feed for a new
// replica, Depart stops it and drops its entries, a replica that comes
// back starts cold, a retired handle is reused once its feed ended, and
// Close stops the rest (TestMain checks for leaked goroutines).
func TestTemplateFeedLifecycle(t *testing.T) {
	p1, p2, p3 := newTestPub(t, "", false), newTestPub(t, "", false), newTestPub(t, "", false)
	k1, k2, k3 := keyFor(t, p1), keyFor(t, p2), keyFor(t, p3)
	pr, err := NewPrecise(PreciseConfig{
		Index:      Config{BlockSize: 4},
		Template:   &TemplateConfig{Feed: FeedSpec{Upstream: "*", Events: "tcp://{upstream.host}:{upstream.port}"}, Topic: "kv"},
		Subscriber: SubscriberConfig{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	pr.Start(context.Background())
	x := pr.Index()
	if !pr.Bind(0, k1) || !pr.Bind(1, k2) || !pr.Bind(1, k2) {
		t.Fatal("template feeds not started")
	}
	if n := pr.TemplateFeeds(); n != 2 {
		t.Fatalf("template feeds %d, want 2", n)
	}
	r1, _ := x.Lookup(k1)
	r2, _ := x.Lookup(k2)
	p1.sync(t, x, r1)
	p2.sync(t, x, r2)
	prompt := seqTokens(10, 8)
	p1.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 4, prompt, 1, 2)}, 0), false)
	p2.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 4, prompt[:4], 7)}, 0), false)
	eventually(t, "both replicas' entries", func() bool { return x.Entries() == 3 && x.Fresh(r1) && x.Fresh(r2) })
	if b, _ := pr.tokenizeBase(true); b != "http://"+k1 && b != "http://"+k2 {
		t.Errorf("tokenize base %q, want a template engine", b)
	}

	pr.Depart(0, k1)
	if n := pr.TemplateFeeds(); n != 1 {
		t.Fatalf("template feeds %d after a departure, want 1", n)
	}
	if _, ok := x.Lookup(k1); ok || x.Entries() != 1 || x.Fresh(r1) || x.Fences(FenceDeparted) != 1 {
		t.Fatalf("after departure: lookup ok, entries %d, fresh %v, fences %d", x.Entries(), x.Fresh(r1), x.Fences(FenceDeparted))
	}
	if pr.replicaOf(0) >= 0 {
		t.Error("slot 0 still bound")
	}
	for range 3 {
		if b, _ := pr.tokenizeBase(false); b != "http://"+k2 {
			t.Errorf("tokenize base %q after the departure, want %s", b, "http://"+k2)
		}
	}
	// The departed feed ends and its handle is freed.
	eventually(t, "the departed feed ended", func() bool {
		x.mu.RLock()
		defer x.mu.RUnlock()
		return len(x.free) == 1
	})
	// Its events no longer land.
	p1.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 4, seqTokens(50, 4), 9)}, 0), false)
	p2.sync(t, x, r2)

	// A new replica takes the freed handle, cold.
	if !pr.Bind(0, k3) {
		t.Fatal("k3: no feed")
	}
	if r3, _ := x.Lookup(k3); r3 != r1 || x.Fresh(r3) || x.Stats(r3).Entries != 0 || x.Stats(r3).ID != k3 {
		t.Errorf("k3: handle %d (want %d), stats %+v", r3, r1, x.Stats(r3))
	}
	// The departed one comes back, cold, under another handle.
	if !pr.Bind(2, k1) {
		t.Fatal("k1 back: no feed")
	}
	r1b, _ := x.Lookup(k1)
	if r1b == r1 || x.Fresh(r1b) || x.Stats(r1b).Entries != 0 {
		t.Errorf("k1 back: handle %d, stats %+v", r1b, x.Stats(r1b))
	}
	p1.sync(t, x, r1b)
	p1.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 4, prompt[:4], 11)}, 0), false)
	eventually(t, "k1's new entry", func() bool { return x.Stats(r1b).Entries == 1 })
	if n := pr.TemplateFeeds(); n != 3 {
		t.Errorf("template feeds %d, want 3", n)
	}
	if err := pr.Close(); err != nil {
		t.Fatal(err)
	}
	if pr.Bind(3, "127.0.0.1:21002") {
		t.Error("a closed Precise started a feed")
	}
}

// TestTemplateBadKeyAndStatic: a key the template cannot expand gets no feed
// (routed by the estimate), and a static feed's key is not templated.
func TestTemplateBadKeyAndStatic(t *testing.T) {
	pr, err := NewPrecise(PreciseConfig{
		Engines:  []PreciseEngine{{Feed: Endpoint{Replica: "127.0.0.1:8009"}}},
		Template: &TemplateConfig{Feed: FeedSpec{Upstream: "*", Events: "tcp://{upstream.host}:21557", Ranks: 2}},
		Subscriber: SubscriberConfig{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
			DialTimeout: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	for range 2 { // the second time from the bad-key memory
		if pr.Bind(0, "127.0.0.1:21000") {
			t.Error("a key without a rank got a feed from a 2-rank template")
		}
	}
	if !pr.Bind(1, "127.0.0.1:8009") || pr.TemplateFeeds() != 0 {
		t.Error("the static feed was templated")
	}
	pr.BindAll([]selection.Slot{2, 3}, []string{"127.0.0.1:21001#0", "127.0.0.1:21001#1"})
	if pr.TemplateFeeds() != 2 {
		t.Errorf("template feeds %d, want 2", pr.TemplateFeeds())
	}
	pr.Depart(2, "127.0.0.1:21001#0")
	pr.Depart(2, "127.0.0.1:21001#0") // twice: a no-op
	if pr.TemplateFeeds() != 1 {
		t.Errorf("template feeds %d, want 1", pr.TemplateFeeds())
	}
}

// TestResolveEndpoint: a feed's host name resolved through its own DNS
// servers (a stub on 127.0.0.1 answering one A record).
func TestResolveEndpoint(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	defer func() { pc.Close(); <-done }()
	go func() { // a minimal DNS server: any A query of engine.test. -> 127.0.0.1
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			if n < 12 {
				continue
			}
			// Header: same id, QR+RD+RA, one question; answer A only for
			// type A (the question's type is the 2 bytes after its name).
			end := 12
			for end < n && q[end] != 0 {
				end += int(q[end]) + 1
			}
			qtype := int(q[end+1])<<8 | int(q[end+2])
			resp := append([]byte{q[0], q[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0}, q[12:end+5]...)
			if qtype == 1 {
				resp[7] = 1
				resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 127, 0, 0, 1)
			}
			_, _ = pc.WriteTo(resp, from)
		}
	}()
	server := pc.LocalAddr().String()
	got, err := resolveEndpoint(context.Background(), "tcp://engine.test.:21557", []string{server})
	if err != nil || got != "tcp://127.0.0.1:21557" {
		t.Errorf("got %q, %v", got, err)
	}
	if got, _ := resolveEndpoint(context.Background(), "tcp://[::1]:21557", []string{server}); got != "tcp://[::1]:21557" {
		t.Errorf("an IP was resolved: %q", got)
	}
	if got, _ := resolveEndpoint(context.Background(), "tcp://engine.test.:21557", nil); got != "tcp://engine.test.:21557" {
		t.Errorf("resolved without resolvers: %q", got)
	}
	if err := ValidateFeeds([]FeedSpec{{Upstream: "*", Events: "tcp://{upstream.host}:5557", Resolvers: []string{"a b"}}}); err == nil {
		t.Error("a bad resolver accepted")
	}
	if a, err := resolverAddr("127.0.0.1"); err != nil || a != "127.0.0.1:53" {
		t.Errorf("resolverAddr: %q %v", a, err)
	}
}

// TestTemplateCanaryTargets: with a template and no static engine the
// canary starts with no target, probes the live template engines (with
// the template's scheme) and drops a departed one.
func TestTemplateCanaryTargets(t *testing.T) {
	pr, err := NewPrecise(PreciseConfig{
		Template: &TemplateConfig{Feed: FeedSpec{Upstream: "*", Events: "tcp://{upstream.host}:{upstream.port+1}", Scheme: "https"}},
		Canary:   CanaryConfig{Model: "m"},
		Subscriber: SubscriberConfig{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
			DialTimeout: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	c := pr.Canary()
	targets := func() []CanaryTarget {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.targets
	}
	if _, err := c.Probe(context.Background()); err == nil || c.Errors() != 0 {
		t.Errorf("probe without a target: %v, errors %d", err, c.Errors())
	}
	if !pr.Bind(0, "127.0.0.1:21030") {
		t.Fatal("no feed")
	}
	if tg := targets(); len(tg) != 1 || tg[0].BaseURL != "https://127.0.0.1:21030" {
		t.Errorf("targets %+v", tg)
	}
	pr.Depart(0, "127.0.0.1:21030")
	if tg := targets(); len(tg) != 0 {
		t.Errorf("targets after the departure %+v", tg)
	}
	if _, err := pr.tokenizeBase(false); err == nil {
		t.Error("a tokenize base with no engine left")
	}
}
