package module

import (
	"github.com/ramjet-llm/ramjet/selection"

	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/fleetstate"

	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/upstream"
)

// integrityCaddyfile is a Caddyfile with GET /health and the ramjet policy
// over dials, with the integrity block given.
func integrityCaddyfile(dials []string, block string) string {
	ups := strings.Join(dials, " ")
	return `{
	admin {ADMIN}
	auto_https off
}
http://{ADDR} {
	handle /health {
		ramjet_health ` + ups + `
	}
	handle {
		ramjet_observe
		reverse_proxy ` + ups + ` {
			lb_policy ramjet {
				integrity {
` + block + `
				}
			}
		}
	}
}`
}

// healthOf reads GET /health.
func (c *testCaddy) healthOf() fleetstate.HealthReport {
	c.t.Helper()
	_, b := c.do(http.MethodGet, c.url("/health"), "")
	var rep fleetstate.HealthReport
	if err := json.Unmarshal(b, &rep); err != nil {
		c.t.Fatalf("decoding /health %s: %v", b, err)
	}
	return rep
}

// fleetIntegrity reads GET /ramjet/fleet: the integrity state of every
// replica by route id.
func (c *testCaddy) fleetIntegrity() map[string]*fleetstate.IntegrityReport {
	c.t.Helper()
	_, b := c.do(http.MethodGet, "http://"+c.admin+"/ramjet/fleet", "")
	var out struct {
		Fleets []struct {
			Replicas []fleetstate.ReplicaSnapshot `json:"replicas"`
		} `json:"fleets"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		c.t.Fatalf("decoding /ramjet/fleet %s: %v", b, err)
	}
	m := map[string]*fleetstate.IntegrityReport{}
	for _, f := range out.Fleets {
		for _, r := range f.Replicas {
			m[r.ID] = r.Integrity
		}
	}
	return m
}

func (c *testCaddy) adminMetrics() string {
	c.t.Helper()
	_, b := c.do(http.MethodGet, "http://"+c.admin+"/metrics", "")
	return string(b)
}

// integrityOf returns the /health entry of the replica at dial.
func healthEntry(rep fleetstate.HealthReport, id string) fleetstate.ReplicaHealth {
	for _, r := range rep.Replicas {
		if r.ID == id {
			return r
		}
	}
	return fleetstate.ReplicaHealth{}
}

// TestIntegrityPinMismatchE2E: through the real Caddy in front of three
// simulators, a replica whose weights digest stops matching the pin is
// taken out, exactly that one (/health, /ramjet/fleet, the metric, and no
// request reaches it), and comes back in when the digest matches again.
func TestIntegrityPinMismatchE2E(t *testing.T) {
	ss := startSims(t, 3, enginesim.Options{Instant: true})
	def := enginesim.DefaultIdentity("qwen3-8b")
	c := startCaddyfile(t, integrityCaddyfile(ss.dials(), fmt.Sprintf(`
					model_sha256 %s
					chat_template_sha256 %s
					interval 50ms
					timeout 5s`, def.ModelSHA256, def.TemplateSHA256)))
	// The first request shows the policy its pool; /health names the
	// replicas too. Until the first identity answer they are out.
	c.chat(chatBody("qwen3-8b", false, [2]string{"user", "hello"}))
	eventually(t, "every replica admitted", func() bool { return c.healthOf().Status == fleetstate.StatusOK })

	f := lookupFleet("")
	bad := f.RouteID(ss[1].Addr())
	if err := ss[1].SetIdentity(enginesim.Identity{ModelSHA256: enginesim.Digest("other weights")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the mismatching replica out", func() bool {
		return healthEntry(c.healthOf(), bad).Integrity == string(integrity.ReasonModelMismatch)
	})
	rep := c.healthOf()
	if rep.Status != fleetstate.StatusDegraded || rep.Healthy != 2 {
		t.Fatalf("health %+v", rep)
	}
	if e := healthEntry(rep, bad); e.Healthy || e.Reason != "integrity" {
		t.Fatalf("bad replica %+v", e)
	}
	fl := c.fleetIntegrity()
	if r := fl[bad]; r == nil || !r.Out || r.Reason != "model_mismatch" || r.Attested {
		t.Fatalf("/ramjet/fleet bad replica %+v", r)
	}
	for _, s := range []*enginesim.Server{ss[0], ss[2]} {
		if r := fl[f.RouteID(s.Addr())]; r == nil || r.Out || !r.Attested {
			t.Fatalf("/ramjet/fleet good replica %+v", r)
		}
	}
	if m := c.adminMetrics(); !strings.Contains(m, `ramjet_integrity_reason{fleet="default",reason="model_mismatch",upstream="`+bad+`"} 1`) ||
		!strings.Contains(m, `ramjet_integrity_out{fleet="default",upstream="`+bad+`"} 1`) {
		t.Fatalf("metrics lack the mismatch:\n%s", grepLines(m, "ramjet_integrity"))
	}
	before := ss.requests()
	for i := range 30 {
		resp, b := c.chat(chatBody("qwen3-8b", false, [2]string{"user", fmt.Sprintf("prompt %d %s", i, longText("x", 200))}))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		if resp.Header.Get(HeaderUpstream) == bad {
			t.Fatal("a request was routed to the mismatching replica")
		}
	}
	after := ss.requests()
	if after[1] != before[1] || after[0]+after[2]-before[0]-before[2] != 30 {
		t.Fatalf("requests before %v after %v", before, after)
	}

	// Fixed: back in.
	if err := ss[1].SetIdentity(enginesim.Identity{ModelSHA256: def.ModelSHA256}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the fixed replica re-admitted", func() bool { return c.healthOf().Status == fleetstate.StatusOK })
	eventually(t, "traffic reaching the fixed replica", func() bool {
		c.chat(chatBody("qwen3-8b", false, [2]string{"user", longText(fmt.Sprint("again", time.Now().UnixNano()), 300)}))
		return ss.requests()[1] > before[1]
	})

	// An engine without the contract is out too (fail closed).
	if err := ss[2].SetIdentity(enginesim.Identity{Serve: "off"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replica without the contract out", func() bool {
		return healthEntry(c.healthOf(), f.RouteID(ss[2].Addr())).Integrity == string(integrity.ReasonBadStatus)
	})
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// load sends requests to c until stop is closed, one at a time.
func loadUntil(c *testCaddy, stop <-chan struct{}, wg *sync.WaitGroup, sent *atomic.Int64) {
	defer wg.Done()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		body := chatBody("qwen3-8b", false, [2]string{"user", longText(fmt.Sprint("load", i, time.Now().UnixNano()), 300)})
		resp, err := http.Post(c.url("/v1/chat/completions"), "application/json", strings.NewReader(body))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		sent.Add(1)
		if i > 200000 {
			return // bounded
		}
	}
}

const childEnvConfig = "INTEGRITY_TEST_CHILD_CADDYFILE"
const childEnvOut = "INTEGRITY_TEST_CHILD_OUT"

// TestIntegrityChildCaddy is not a test: it is the ramjet process that
// TestIntegritySpecQuarantineE2E kills with SIGKILL. It serves the
// Caddyfile it is given until its standard input closes.
func TestIntegrityChildCaddy(t *testing.T) {
	src := os.Getenv(childEnvConfig)
	if src == "" {
		t.Skip("only run as the child of TestIntegritySpecQuarantineE2E")
	}
	c := startCaddyfile(t, src)
	tmp := os.Getenv(childEnvOut) + ".tmp"
	if err := os.WriteFile(tmp, []byte(c.client+" "+c.admin), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, os.Getenv(childEnvOut)); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent goes away
	os.Exit(0)                           // never a clean Caddy shutdown
}

// startChild runs the Caddyfile in a child process (this test binary) and
// returns a testCaddy handle on it and the process.
func startChild(t *testing.T, src string) (*testCaddy, *exec.Cmd) {
	out := filepath.Join(t.TempDir(), "addrs")
	cmd := exec.Command(os.Args[0], "-test.run=^TestIntegrityChildCaddy$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), childEnvConfig+"="+src, childEnvOut+"="+out)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	var addrs []string
	eventually(t, "the child ramjet listening", func() bool {
		b, err := os.ReadFile(out)
		addrs = strings.Fields(string(b))
		return err == nil && len(addrs) == 2
	})
	return &testCaddy{t: t, client: addrs[0], admin: addrs[1]}, cmd
}

// TestIntegritySpecQuarantineE2E: a simulator whose speculative acceptance
// collapses is quarantined in enforce mode (the commitment durable in the
// state file first); ramjet is killed with SIGKILL (a child process: no
// clean shutdown of any kind), and the ramjet started after it on the same
// state file holds the same engine instance out, also after that engine
// restarts and accepts drafts again, and admits it only once a different
// attested instance answers at its address.
func TestIntegritySpecQuarantineE2E(t *testing.T) {
	ss := startSims(t, 2, enginesim.Options{Instant: true, Engine: engine.Config{SpecTokens: 3}})
	state := filepath.Join(t.TempDir(), "integrity.state")
	t.Setenv("INTEGRITY_TEST_KEY", "integrity-e2e-commitment-key-0123456789")
	block := `
					interval 50ms
					timeout 5s
					spec_decode enforce {
						window 100ms
						windows 3
						state_file ` + state + `
						commitment_key {env.INTEGRITY_TEST_KEY}
					}`
	src := integrityCaddyfile(ss.dials(), block)

	child, cmd := startChild(t, src)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent atomic.Int64
	wg.Add(1)
	go loadUntil(child, stop, &wg, &sent)
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopLoad)
	eventually(t, "both replicas admitted in the child", func() bool { return child.healthOf().Status == fleetstate.StatusOK })

	zero := 0.0
	if err := ss[0].SetFaults(enginesim.Faults{SpecAcceptance: &zero}); err != nil {
		t.Fatal(err)
	}
	var badID string
	eventually(t, "the collapsed replica quarantined, durably", func() bool {
		for id, r := range child.fleetIntegrity() {
			if r != nil && r.Quarantined && r.Durable {
				badID = id
				return true
			}
		}
		return false
	})
	rep := child.healthOf()
	if e := healthEntry(rep, badID); e.Healthy || e.Reason != "integrity" || e.Integrity != "spec_collapse" || rep.Healthy != 1 {
		t.Fatalf("child health %+v", rep)
	}
	stopLoad()
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		_, port, _ := strings.Cut(s.Addr(), ":")
		if bytes.Contains(b, []byte(port)) || bytes.Contains(b, []byte(s.Identity().InstanceID)) {
			t.Fatalf("state file names an address or an instance id: %s", b)
		}
	}

	// kill -9.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	// The restarted ramjet (in process), same state file.
	if err := ss[0].SetFaults(enginesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	ss[0].Restart() // the same instance, restarted and accepting again
	c := startCaddyfile(t, src)
	c.chat(chatBody("qwen3-8b", false, [2]string{"user", "hello"}))
	f := lookupFleet("")
	bad := f.RouteID(ss[0].Addr())
	good := f.RouteID(ss[1].Addr())
	eventually(t, "the same instance fenced after the restart", func() bool {
		e := healthEntry(c.healthOf(), bad)
		return e.Integrity == string(integrity.ReasonFenced) && !e.Healthy
	})
	if e := healthEntry(c.healthOf(), good); !e.Healthy {
		t.Fatalf("the good replica is out after the restart: %+v", e)
	}
	// Drafts accepted again on the same instance: still out, and no
	// request reaches it.
	before := ss.requests()
	for i := range 20 {
		resp, body := c.chat(chatBody("qwen3-8b", false, [2]string{"user", longText(fmt.Sprint("after", i), 300)}))
		if resp.StatusCode != 200 || resp.Header.Get(HeaderUpstream) != good {
			t.Fatalf("request %d: %d via %s: %s\nhealth %+v", i, resp.StatusCode, resp.Header.Get(HeaderUpstream), body, c.healthOf())
		}
	}
	if ss.requests()[0] != before[0] {
		t.Fatal("the fenced replica got requests")
	}
	if m := c.adminMetrics(); !strings.Contains(m, `ramjet_spec_decode_quarantined{fleet="default",upstream="`+bad+`"} 1`) {
		t.Fatalf("metrics lack the quarantine:\n%s", grepLines(m, "ramjet_spec_decode"))
	}

	// A different attested instance at that address: rearmed.
	if err := ss[0].SetIdentity(enginesim.Identity{InstanceID: "replacement-instance"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new instance admitted", func() bool { return c.healthOf().Status == fleetstate.StatusOK })
	eventually(t, "traffic reaching the new instance", func() bool {
		c.chat(chatBody("qwen3-8b", false, [2]string{"user", longText(fmt.Sprint("new", time.Now().UnixNano()), 300)}))
		return ss.requests()[0] > before[0]
	})
}

// TestIntegrityObserveKeepsRouting: observe mode reports a collapse and
// keeps the replica in.
func TestIntegrityObserveKeepsRouting(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{Instant: true, Engine: engine.Config{SpecTokens: 3}})
	zero := 0.0
	if err := ss[0].SetFaults(enginesim.Faults{SpecAcceptance: &zero}); err != nil {
		t.Fatal(err)
	}
	c := startCaddyfile(t, integrityCaddyfile(ss.dials(), `
					interval 50ms
					spec_decode observe {
						window 100ms
						windows 2
					}`))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent atomic.Int64
	wg.Add(1)
	go loadUntil(c, stop, &wg, &sent)
	defer func() { close(stop); wg.Wait() }()
	id := ""
	eventually(t, "the collapse observed", func() bool {
		rep := c.healthOf()
		if len(rep.Replicas) == 1 && rep.Replicas[0].Integrity == "spec_collapse" {
			id = rep.Replicas[0].ID
			return rep.Status == fleetstate.StatusOK
		}
		return false
	})
	if r := c.fleetIntegrity()[id]; r == nil || !r.Observed || r.Out {
		t.Fatalf("fleet %+v", r)
	}
	resp, _ := c.chat(chatBody("qwen3-8b", false, [2]string{"user", "still routed"}))
	if resp.StatusCode != 200 {
		t.Fatalf("observe mode: %d", resp.StatusCode)
	}
}

func TestIntegrityCaddyfile(t *testing.T) {
	pin := strings.Repeat("ab", 32)
	pos := 1
	tests := []struct {
		name    string
		give    string
		want    *integrity.Settings
		wantErr string
	}{
		{name: "pins", give: `integrity {
			model_sha256 ` + pin + `
			chat_template_sha256 ` + pin + `
			tokenizer_sha256 ` + pin + `
			interval 5s
			timeout 1s
			scheme https
			identity_path /id
			upstream_token {env.RJ_UPSTREAM_TOKEN}
		}`, want: &integrity.Settings{Pins: integrity.Pins{ModelSHA256: pin, TemplateSHA256: pin, TokenizerSHA256: pin},
			Interval: duration.Duration(5 * time.Second), Timeout: duration.Duration(time.Second), IdentityPath: "/id",
			Access: upstream.Access{Scheme: "https", UpstreamToken: "{env.RJ_UPSTREAM_TOKEN}"}}},
		{name: "spec", give: `integrity {
			spec_decode enforce {
				window 30s
				windows 4
				position 1
				metrics_path /m
				state_file /var/lib/ramjet/integrity.state
				commitment_key {env.RJ_INTEGRITY_KEY}
			}
		}`, want: &integrity.Settings{Spec: &integrity.SpecSettings{Mode: "enforce", Window: duration.Duration(30 * time.Second),
			Windows: 4, Position: &pos, MetricsPath: "/m", StateFile: "/var/lib/ramjet/integrity.state",
			CommitmentKey: "{env.RJ_INTEGRITY_KEY}"}}},
		{name: "spec overall", give: `integrity {
			spec_decode {
				position overall
			}
		}`, want: &integrity.Settings{Spec: &integrity.SpecSettings{}}},
		{name: "unknown", give: `integrity {
			bogus 1
		}`, wantErr: "integrity: unrecognized option 'bogus'"},
		{name: "duplicate", give: `integrity {
			interval 1s
			interval 2s
		}`, wantErr: "more than once"},
		{name: "bad mode", give: `integrity {
			spec_decode sometimes
		}`, wantErr: "want observe or enforce"},
		{name: "bad position", give: `integrity {
			spec_decode {
				position -1
			}
		}`, wantErr: "position"},
		{name: "bad duration", give: `integrity {
			interval soon
		}`, wantErr: "positive duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := caddyfile.NewTestDispenser("ramjet {\n" + tt.give + "\n}")
			var s RamjetSelection
			err := s.UnmarshalCaddyfile(d)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, s.Integrity); diff != "" {
				t.Fatalf("(-want +got)\n%s", diff)
			}
		})
	}
}

// TestIntegritySettings: the policy's integrity settings are provisioned
// with the secrets resolved and the defaults filled (integrity.TestSettings
// covers the validation itself).
func TestIntegritySettings(t *testing.T) {
	t.Setenv("TEST_INTEGRITY_COMMITMENT_KEY", strings.Repeat("k", 32))
	pos := 2
	c := integrity.Settings{Pins: integrity.Pins{ModelSHA256: strings.Repeat("ab", 32)}, Timeout: duration.Duration(time.Second),
		Access: upstream.Access{UpstreamToken: "tok"},
		Spec:   &integrity.SpecSettings{Mode: "enforce", Position: &pos, StateFile: "/tmp/x", CommitmentKey: "{env.TEST_INTEGRITY_COMMITMENT_KEY}"}}
	want := integrity.Settings{Pins: c.Pins, IdentityPath: integrity.DefaultIdentityPath,
		Interval: duration.Duration(10 * time.Second), Timeout: duration.Duration(time.Second),
		Access: upstream.Access{Scheme: "http", UpstreamToken: "tok"}, Token: "tok",
		Spec: &integrity.SpecSettings{Mode: "enforce", Window: duration.Duration(10 * time.Second), Windows: 3, Position: &pos,
			MetricsPath: "/metrics", StateFile: "/tmp/x", CommitmentKey: "{env.TEST_INTEGRITY_COMMITMENT_KEY}",
			Key: []byte(strings.Repeat("k", 32))}}
	got := c.Resolved(resolveSecret)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if c.Spec.Key != nil {
		t.Error("resolved changed its argument's spec_decode")
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestIntegrityOffIsFree: without integrity the filter is one nil check
// and decide still allocates nothing (TestDecideAllocs covers the rest).
func TestIntegrityOffIsFree(t *testing.T) {
	var s RamjetSelection
	if s.integrityOut(0) {
		t.Fatal("out without integrity")
	}
	if n := testing.AllocsPerRun(100, func() { s.integrityOut(3) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}

// TestIntegrityDeployCaddyfile: the production Caddyfile turns integrity
// on from RJ_* settings; a simulator with other weights is out, the other
// in; a bad RJ_SPEC_DECODE stops startup naming the setting.
func TestIntegrityDeployCaddyfile(t *testing.T) {
	ss := startSims(t, 2, enginesim.Options{Instant: true})
	def := enginesim.DefaultIdentity("qwen3-8b")
	if err := ss[1].SetIdentity(enginesim.Identity{ModelSHA256: enginesim.Digest("other")}); err != nil {
		t.Fatal(err)
	}
	src := deployCaddyfile(t)
	if _, err := loadCaddyfile(t, src, map[string]string{"RJ_UPSTREAM": strings.Join(ss.dials(), ","),
		"RJ_SPEC_DECODE": "sometimes"}); err == nil || !strings.Contains(err.Error(), "spec_decode") {
		t.Fatalf("bad RJ_SPEC_DECODE: %v", err)
	}
	p := mustLoad(t, src, map[string]string{
		"RJ_UPSTREAM":               strings.Join(ss.dials(), ","),
		"RJ_INTEGRITY_MODEL_SHA256": def.ModelSHA256,
		"RJ_INTEGRITY_INTERVAL":     "50ms",
		"RJ_SPEC_DECODE":            "observe",
		"RJ_SPEC_DECODE_WINDOW":     "100ms",
	})
	var last []byte
	defer func() {
		if t.Failed() {
			t.Logf("last /health: %s", last)
		}
	}()
	eventually(t, "the replica with other weights out, the other in", func() bool {
		resp, err := http.Get(p.base + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var rep fleetstate.HealthReport
		last, _ = io.ReadAll(resp.Body)
		if json.Unmarshal(last, &rep) != nil || len(rep.Replicas) != 2 {
			return false
		}
		// /health lists the replicas in upstream order.
		bad, good := rep.Replicas[1], rep.Replicas[0]
		return bad.Reason == "integrity" && bad.Integrity == "model_mismatch" && good.Healthy && good.Integrity == ""
	})
}

// TestIntegrityMetricsDocumented: every integrity series is in
// OBSERVABILITY.md and module/README.md, and lints clean.
func TestIntegrityMetricsDocumented(t *testing.T) {
	names := describedNames(integCollector())
	if len(names) != 12 {
		t.Fatalf("%d series", len(names))
	}
	for _, file := range []string{"OBSERVABILITY.md", "README.md"} {
		doc, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for n := range names {
			if !strings.Contains(string(doc), "`"+n+"`") {
				t.Errorf("series %s is not documented in module/%s", n, file)
			}
		}
	}
	probs, err := testutil.CollectAndLint(integCollector())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}

// TestIntegrityAdmittedChangesNoDecision: the same traffic through a
// policy without integrity and one with integrity on (every replica
// admitted) gets the same decision every time; once a replica is out,
// no decision names it.
func TestIntegrityAdmittedChangesNoDecision(t *testing.T) {
	ss := startSims(t, 4, enginesim.Options{Instant: true})
	def := enginesim.DefaultIdentity("qwen3-8b")
	poolOf := func() reverseproxy.UpstreamPool {
		pool := make(reverseproxy.UpstreamPool, len(ss))
		for i, s := range ss {
			pool[i] = &reverseproxy.Upstream{Dial: s.Addr(), Host: new(reverseproxy.Host)}
		}
		return pool
	}
	plain := newTestPolicy(t, "integ-same-plain")
	checked := &RamjetSelection{PolicySettings: fleetstate.PolicySettings{StateKey: "integ-same-checked",
		Integrity: &integrity.Settings{Pins: integrity.Pins{ModelSHA256: def.ModelSHA256}, Interval: duration.Duration(50 * time.Millisecond)}}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := checked.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { checked.Cleanup(); cancel() })
	poolA, poolB := poolOf(), poolOf()
	checked.viewFor(poolB) // the policy sees its pool: checks start
	eventually(t, "every replica admitted", func() bool {
		for _, s := range ss {
			if checked.integ.Monitor().Out(s.Addr()) {
				return false
			}
		}
		return true
	})
	checked.integ.Refresh()

	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	pick := func(p *RamjetSelection, pool reverseproxy.UpstreamPool, body []byte) int {
		rctx, rcancel := context.WithCancel(context.Background())
		cancels = append(cancels, rcancel) // held: load builds up alike in both
		up := p.Select(pool, newTestRequest(rctx, body), nil)
		for i := range pool {
			if pool[i] == up {
				return i
			}
		}
		return -1
	}
	var gotA, gotB []int
	for i := range 120 {
		body := chatJSON(2048+512*(i%7), fmt.Sprintf("user %d", i%13))
		gotA = append(gotA, pick(plain, poolA, body))
		gotB = append(gotB, pick(checked, poolB, body))
	}
	if diff := cmp.Diff(gotA, gotB); diff != "" {
		t.Fatalf("decisions differ with integrity on (-off +on):\n%s", diff)
	}
	spread := map[int]bool{}
	for _, i := range gotA {
		spread[i] = true
	}
	if len(spread) < 2 {
		t.Fatalf("traffic went to %d replica(s) only: the comparison shows little", len(spread))
	}

	if err := ss[2].SetIdentity(enginesim.Identity{ModelSHA256: enginesim.Digest("other")}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "replica 2 out", func() bool { return checked.integrityOut(checked.viewFor(poolB).Slots[2]) })
	for i := range 60 {
		if got := pick(checked, poolB, chatJSON(2048+512*(i%7), fmt.Sprintf("user %d", i%13))); got == 2 || got < 0 {
			t.Fatalf("request %d routed to %d", i, got)
		}
	}
}

// TestSessionShadowChangesNoDecision: the same traffic (sessions whose
// requests are held open, so that load overrides affinity now and then)
// through a policy without and one with the session shadow gets the same
// decision every time; the shadow accounts every request with a session
// key, scores its disagreements, and explain reports the sticky choice.
func TestSessionShadowChangesNoDecision(t *testing.T) {
	plain := newTestPolicy(t, "shadow-plain")
	shadowed := &RamjetSelection{PolicySettings: fleetstate.PolicySettings{StateKey: "shadow-on", SessionShadow: &integrity.ShadowSettings{MaxSessions: 64}}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := shadowed.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shadowed.Cleanup(); cancel() })
	poolA, poolB := newTestPool(4), newTestPool(4) // never dialled: Select only
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	pick := func(p *RamjetSelection, pool reverseproxy.UpstreamPool, body []byte, session string) int {
		rctx, rcancel := context.WithCancel(context.Background())
		cancels = append(cancels, rcancel)
		r := newTestRequest(rctx, body)
		if session != "" {
			r.Header.Set("X-Session-ID", session)
		}
		up := p.Select(pool, r, nil)
		for i := range pool {
			if pool[i] == up {
				return i
			}
		}
		return -1
	}
	m := integCollector().Shadow
	before := map[string]float64{}
	for _, o := range integrity.ShadowOutcomes {
		before[o.String()] = testutil.ToFloat64(m.Decisions.WithLabelValues("shadow-on", o.String()))
	}
	var gotA, gotB []int
	const n = 160
	withKey := 0
	for i := range n {
		sess := fmt.Sprintf("session-%d", i%9)
		if i%10 == 9 {
			sess = "" // some requests carry no session
		} else {
			withKey++
		}
		body := chatJSON(1024+2048*(i%9), fmt.Sprintf("turn %d", i/9))
		gotA = append(gotA, pick(plain, poolA, body, sess))
		gotB = append(gotB, pick(shadowed, poolB, body, sess))
	}
	if diff := cmp.Diff(gotA, gotB); diff != "" {
		t.Fatalf("decisions differ with the session shadow (-off +on):\n%s", diff)
	}
	total, disagree := 0.0, 0.0
	for _, o := range integrity.ShadowOutcomes {
		d := testutil.ToFloat64(m.Decisions.WithLabelValues("shadow-on", o.String())) - before[o.String()]
		total += d
		if o == integrity.ShadowDisagree {
			disagree = d
		}
	}
	if int(total) != withKey {
		t.Fatalf("shadow accounted %v requests, %d carried a session key", total, withKey)
	}
	if c := shadowed.shadow.ss.Counts(); int(c[integrity.ShadowNew]) != 9 {
		t.Fatalf("new sessions %d, want 9", c[integrity.ShadowNew])
	}
	if disagree == 0 {
		t.Fatal("no disagreement: held load should move some sessions")
	}
	// Every disagreement was scored, for both choices.
	h := &dto.Metric{}
	if err := m.Overlap.WithLabelValues("shadow-on", "sticky").(prometheus.Histogram).Write(h); err != nil {
		t.Fatal(err)
	}
	if got := h.GetHistogram().GetSampleCount(); float64(got) < disagree {
		t.Fatalf("%d sticky overlaps observed for %v disagreements", got, disagree)
	}

	// explain: the sticky choice of a known session.
	f := lookupFleet("shadow-on")
	req := httptest.NewRequest(http.MethodPost, "/ramjet/explain?fleet=shadow-on", bytes.NewReader(chatJSON(1024, "turn 99")))
	req.Header.Set("X-Session-ID", "session-0")
	rec := httptest.NewRecorder()
	if err := (&AdminAPI{}).handleExplain(rec, req); err != nil {
		t.Fatal(err)
	}
	var ex fleetstate.Explanation
	if err := json.Unmarshal(rec.Body.Bytes(), &ex); err != nil {
		t.Fatal(err)
	}
	slot, _ := shadowed.shadow.ss.Sticky(xxhash.Sum64String("session-0"))
	if ex.Session == nil || !ex.Session.Known || ex.Session.StickyUpstream != f.SlotID(selection.Slot(slot)) {
		t.Fatalf("explain session %+v", ex.Session)
	}
}

func TestSessionShadowCaddyfile(t *testing.T) {
	tests := []struct {
		give    string
		want    *integrity.ShadowSettings
		wantErr string
	}{
		{give: "session_shadow", want: &integrity.ShadowSettings{}},
		{give: "session_shadow X-Conversation {\n max_sessions 100\n}", want: &integrity.ShadowSettings{Header: "X-Conversation", MaxSessions: 100}},
		{give: "session_shadow {\n max_sessions 0\n}", wantErr: "positive integer"},
		{give: "session_shadow {\n bogus 1\n}", wantErr: "session_shadow: unrecognized option"},
		{give: "session_shadow a b", wantErr: "session_shadow: too many values"},
	}
	for _, tt := range tests {
		var s RamjetSelection
		err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("ramjet {\n" + tt.give + "\n}"))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: error %v, want %q", tt.give, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tt.give, err)
		}
		if diff := cmp.Diff(tt.want, s.SessionShadow); diff != "" {
			t.Errorf("%q (-want +got)\n%s", tt.give, diff)
		}
	}
}
