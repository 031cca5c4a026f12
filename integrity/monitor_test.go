package integrity

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func testIdentity(instance string) Identity {
	return Identity{Contract: Contract, Model: "m", ModelSHA256: digest("weights"),
		TemplateSHA256: digest("template"), TokenizerSHA256: digest("tokenizer"), InstanceID: instance}
}

func TestPinsCheck(t *testing.T) {
	good := testIdentity("a")
	pins := Pins{ModelSHA256: good.ModelSHA256, TemplateSHA256: good.TemplateSHA256, TokenizerSHA256: good.TokenizerSHA256}
	tests := []struct {
		name string
		give func(*Identity)
		pins Pins
		want Reason
	}{
		{"match", func(*Identity) {}, pins, ReasonNone},
		{"model", func(i *Identity) { i.ModelSHA256 = digest("other") }, pins, ReasonModelMismatch},
		{"template", func(i *Identity) { i.TemplateSHA256 = digest("other") }, pins, ReasonTemplateMismatch},
		{"tokenizer", func(i *Identity) { i.TokenizerSHA256 = digest("other") }, pins, ReasonTokenizerMismatch},
		{"tokenizer pinned, absent", func(i *Identity) { i.TokenizerSHA256 = "" }, pins, ReasonPartial},
		{"tokenizer unpinned, absent", func(i *Identity) { i.TokenizerSHA256 = "" }, Pins{ModelSHA256: pins.ModelSHA256}, ReasonNone},
		{"no instance", func(i *Identity) { i.InstanceID = "" }, pins, ReasonPartial},
		{"wrong contract", func(i *Identity) { i.Contract = "v0" }, pins, ReasonPartial},
		{"uppercase digest", func(i *Identity) { i.ModelSHA256 = strings.ToUpper(i.ModelSHA256) }, pins, ReasonPartial},
		{"no pins, any digest", func(i *Identity) { i.ModelSHA256 = digest("x") }, Pins{}, ReasonNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := good
			tt.give(&id)
			if got := tt.pins.Check(id); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
	if err := (Pins{ModelSHA256: "abc"}).Validate(); err == nil || !strings.Contains(err.Error(), "model_sha256") {
		t.Fatalf("short pin accepted: %v", err)
	}
}

func TestCommitmentKeyedAndDistinct(t *testing.T) {
	a := Commitment(testKey, testIdentity("a"), -1)
	if a == Commitment([]byte("another key, 16+ bytes"), testIdentity("a"), -1) {
		t.Fatal("commitment does not depend on the key")
	}
	if a == Commitment(testKey, testIdentity("b"), -1) || a == Commitment(testKey, testIdentity("a"), 0) {
		t.Fatal("distinct instances or ranks share a commitment")
	}
	if a != Commitment(testKey, testIdentity("a"), -1) || !isDigest(a) {
		t.Fatal("commitment not stable")
	}
}

func TestParseSpec(t *testing.T) {
	text := `# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 100
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 40
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 70
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 40
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 30
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 0
`
	all, err := ParseSpec(strings.NewReader(text), -1)
	if err != nil {
		t.Fatal(err)
	}
	if all.DraftTokens != 140 || all.AcceptedTokens != 70 || all.Positions != 2 || all.AcceptedPerPos[0] != 40 || all.AcceptedPerPos[1] != 30 {
		t.Fatalf("summed: %+v", all)
	}
	r1, err := ParseSpec(strings.NewReader(text), 1)
	if err != nil {
		t.Fatal(err)
	}
	if r1.DraftTokens != 40 || r1.AcceptedTokens != 0 || r1.Positions != 1 {
		t.Fatalf("rank 1: %+v", r1)
	}
	if _, err := ParseSpec(strings.NewReader("vllm:num_requests_running 1\n"), -1); err == nil {
		t.Fatal("no spec counters: no error")
	}
}

func TestWindow(t *testing.T) {
	c := func(draft, acc float64, pos ...float64) SpecCounters {
		s := SpecCounters{DraftTokens: draft, AcceptedTokens: acc, Positions: len(pos)}
		copy(s.AcceptedPerPos[:], pos)
		return s
	}
	t.Run("overall", func(t *testing.T) {
		w := NewWindow(WindowConfig{Windows: 3, Position: -1})
		steps := []struct {
			c    SpecCounters
			brk  bool
			want bool
		}{
			{c: c(0, 0)},
			{c: c(100, 0)},             // 1
			{c: c(100, 0)},             // idle: neither counts nor resets
			{c: c(200, 0)},             // 2
			{brk: true},                // failed scrape: chain broken
			{c: c(300, 0)},             // starts a window only
			{c: c(250, 0)},             // counters back: incomplete
			{c: c(400, 0), want: true}, // 3
		}
		for i, s := range steps {
			if s.brk {
				w.Break()
				continue
			}
			if got := w.Observe(s.c); got != s.want {
				t.Fatalf("step %d: collapsed %v, want %v (streak %d)", i, got, s.want, w.Streak())
			}
		}
		w.Reset()
		if w.Observe(c(500, 0)) || w.Streak() != 0 {
			t.Fatal("reset kept the streak")
		}
	})
	t.Run("acceptance resets", func(t *testing.T) {
		w := NewWindow(WindowConfig{Windows: 2, Position: -1})
		w.Observe(c(0, 0))
		w.Observe(c(100, 0))
		w.Observe(c(200, 5))
		if w.Streak() != 0 {
			t.Fatalf("streak %d after accepted tokens", w.Streak())
		}
	})
	t.Run("position", func(t *testing.T) {
		// Position 1 collapses while position 0 still accepts.
		w := NewWindow(WindowConfig{Windows: 2, Position: 1})
		w.Observe(c(0, 0, 0, 0))
		if w.Observe(c(100, 30, 30, 0)) {
			t.Fatal("collapsed after one window")
		}
		if !w.Observe(c(200, 60, 60, 0)) {
			t.Fatalf("position 1 collapse not seen (streak %d)", w.Streak())
		}
		o := NewWindow(WindowConfig{Windows: 2, Position: -1})
		o.Observe(c(0, 0, 0, 0))
		o.Observe(c(100, 30, 30, 0))
		if o.Observe(c(200, 60, 60, 0)) {
			t.Fatal("overall acceptance collapsed")
		}
	})
}

// fakeEngine serves the identity contract and spec counters, changeable
// at run time.
type fakeEngine struct {
	mu       sync.Mutex
	id       Identity
	status   int
	raw      string // when set, served instead of id
	draft    float64
	accepted float64
	srv      *httptest.Server
}

func newFakeEngine(t *testing.T, instance string) *fakeEngine {
	e := &fakeEngine{id: testIdentity(instance), status: 200}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		defer e.mu.Unlock()
		switch r.URL.Path {
		case DefaultIdentityPath:
			w.WriteHeader(e.status)
			if e.raw != "" {
				w.Write([]byte(e.raw))
				return
			}
			json.NewEncoder(w).Encode(e.id)
		case "/metrics":
			fmt.Fprintf(w, "%s{engine=\"0\"} %g\n%s{engine=\"0\"} %g\n", MetricDraftTokens, e.draft, MetricAcceptedTokens, e.accepted)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) set(f func(*fakeEngine)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(e)
}

func (e *fakeEngine) target(key string) Target { return Target{Key: key, BaseURL: e.srv.URL, Rank: -1} }

func TestMonitorAdmission(t *testing.T) {
	a, b := newFakeEngine(t, "a"), newFakeEngine(t, "b")
	id := testIdentity("")
	m, err := NewMonitor(Config{Pins: Pins{ModelSHA256: id.ModelSHA256, TemplateSHA256: id.TemplateSHA256}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m.Add(a.target("a"))
	m.Add(b.target("b"))
	if !m.Out("a") || !m.Out("never-added") {
		t.Fatal("unchecked replicas must be out (fail closed)")
	}
	ctx := context.Background()
	m.CheckNow(ctx)
	if m.Out("a") || m.Out("b") {
		t.Fatalf("matching replicas out: %+v", m.Statuses())
	}
	cases := []struct {
		name string
		f    func(*fakeEngine)
		want Reason
	}{
		{"model", func(e *fakeEngine) { e.id.ModelSHA256 = digest("other") }, ReasonModelMismatch},
		{"template", func(e *fakeEngine) { e.id.TemplateSHA256 = digest("other") }, ReasonTemplateMismatch},
		{"partial", func(e *fakeEngine) { e.raw = `{"contract":"` + Contract + `","model_sha256":"` + id.ModelSHA256 + `"}` }, ReasonPartial},
		{"malformed", func(e *fakeEngine) { e.raw = "<html>" }, ReasonMalformed},
		{"status", func(e *fakeEngine) { e.status = 404 }, ReasonBadStatus},
	}
	for _, c := range cases {
		b.set(func(e *fakeEngine) { e.id, e.raw, e.status = testIdentity("b"), "", 200; c.f(e) })
		m.CheckNow(ctx)
		st, _ := m.Status("b")
		if !st.Out || st.Reason != c.want || m.Out("a") {
			t.Fatalf("%s: b %+v, a out %v", c.name, st, m.Out("a"))
		}
	}
	b.set(func(e *fakeEngine) { e.id, e.raw, e.status = testIdentity("b"), "", 200 })
	m.CheckNow(ctx)
	if m.Out("b") {
		t.Fatal("fixed replica not re-admitted")
	}
	b.srv.Close()
	m.CheckNow(ctx)
	if st, _ := m.Status("b"); !st.Out || st.Reason != ReasonUnreachable {
		t.Fatalf("unreachable: %+v", st)
	}
}

func TestMonitorObserveOnlyNeverFilters(t *testing.T) {
	a := newFakeEngine(t, "a")
	m, err := NewMonitor(Config{Spec: &SpecConfig{Mode: ModeObserve, WindowConfig: WindowConfig{Windows: 2, Position: -1}}})
	if err != nil {
		t.Fatal(err)
	}
	m.Add(a.target("a"))
	if m.Filters() || m.Out("a") {
		t.Fatal("observe mode without pins filters")
	}
	ctx := context.Background()
	m.CheckNow(ctx)
	for i := range 3 {
		a.set(func(e *fakeEngine) { e.draft = float64(100 * i) })
		m.ScrapeNow(ctx)
	}
	st, _ := m.Status("a")
	if !st.Observed || st.Out || st.Reason != ReasonSpecCollapse {
		t.Fatalf("observe: %+v", st)
	}
}

// TestMonitorEnforceStickyAcrossRestart: a collapse in enforce mode is
// committed before it takes effect, survives a new monitor on the same
// state file, is not lifted by the same instance, and is lifted by a
// different attested one.
func TestMonitorEnforceStickyAcrossRestart(t *testing.T) {
	a, b := newFakeEngine(t, "a1"), newFakeEngine(t, "b1")
	path := filepath.Join(t.TempDir(), "state.json")
	newMon := func() *Monitor {
		st, err := OpenStore(path, testKey)
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewMonitor(Config{Spec: &SpecConfig{Mode: ModeEnforce, Store: st, Key: testKey,
			WindowConfig: WindowConfig{Windows: 2, Position: -1}}})
		if err != nil {
			t.Fatal(err)
		}
		m.Add(a.target("a"))
		m.Add(b.target("b"))
		return m
	}
	ctx := context.Background()
	m := newMon()
	m.CheckNow(ctx)
	if m.Out("a") || m.Out("b") {
		t.Fatalf("attested replicas out: %+v", m.Statuses())
	}
	for i := range 3 {
		a.set(func(e *fakeEngine) { e.draft = float64(100 * i) })
		b.set(func(e *fakeEngine) { e.draft, e.accepted = float64(100*i), float64(60*i) })
		m.ScrapeNow(ctx)
	}
	st, _ := m.Status("a")
	if !st.Out || !st.Quarantined || !st.Durable || st.Reason != ReasonSpecCollapse || m.Out("b") {
		t.Fatalf("after collapse: a %+v, b out %v", st, m.Out("b"))
	}
	if ok, _ := m.Writes(); ok != 1 {
		t.Fatalf("%d state writes", ok)
	}

	// Restart (no clean shutdown: nothing was written at the end).
	m2 := newMon()
	if !m2.Out("a") {
		t.Fatal("restarted monitor admits a before its identity is known")
	}
	m2.CheckNow(ctx)
	if st, _ := m2.Status("a"); !st.Out || st.Reason != ReasonFenced {
		t.Fatalf("after restart: %+v", st)
	}
	if m2.Out("b") {
		t.Fatal("b fenced after restart")
	}
	// The same instance, counters reset (an engine restart) and accepting
	// again: still out.
	a.set(func(e *fakeEngine) { e.draft, e.accepted = 10, 10 })
	m2.CheckNow(ctx)
	m2.ScrapeNow(ctx)
	if !m2.Out("a") {
		t.Fatal("a restart of the same instance rearmed it")
	}
	// A different attested instance: rearmed.
	a.set(func(e *fakeEngine) { e.id = testIdentity("a2") })
	m2.CheckNow(ctx)
	if m2.Out("a") {
		t.Fatalf("new instance not admitted: %+v", m2.Statuses())
	}
	// And the broken one coming back is fenced again.
	a.set(func(e *fakeEngine) { e.id = testIdentity("a1") })
	m2.CheckNow(ctx)
	if !m2.Out("a") {
		t.Fatal("the committed instance came back unfenced")
	}
}

func TestMonitorStartClose(t *testing.T) {
	a := newFakeEngine(t, "a")
	changed := make(chan struct{}, 16)
	m, err := NewMonitor(Config{Pins: Pins{ModelSHA256: testIdentity("").ModelSHA256}, Interval: 20 * time.Millisecond,
		OnChange: func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(context.Background())
	m.Add(a.target("a"))
	select {
	case <-changed:
	case <-time.After(20 * time.Second):
		t.Fatal("no change reported after the first check")
	}
	if m.Out("a") {
		t.Fatal("a out after its check")
	}
	m.Close()
}

func TestNewMonitorValidates(t *testing.T) {
	if _, err := NewMonitor(Config{Spec: &SpecConfig{Mode: ModeEnforce}}); err == nil {
		t.Fatal("enforce without a store accepted")
	}
	st, _ := OpenStore(filepath.Join(t.TempDir(), "s"), testKey)
	if _, err := NewMonitor(Config{Spec: &SpecConfig{Mode: ModeEnforce, Store: st, Key: []byte("short")}}); err == nil {
		t.Fatal("short key accepted")
	}
	if _, err := NewMonitor(Config{Pins: Pins{TemplateSHA256: "zz"}}); err == nil {
		t.Fatal("bad pin accepted")
	}
}
