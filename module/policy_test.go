package module

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
)

func TestPolicyUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    RamjetSelection
		wantErr string
	}{
		{name: "empty", give: `ramjet`, want: RamjetSelection{}},
		{name: "empty block", give: "ramjet {\n}", want: RamjetSelection{}},
		{
			name: "every option",
			give: `ramjet {
				affinity_cap 8192
				alpha 0.5
				request_cost 512
				block_tokens 32
				prefix_tokens 16384
				chars_per_token 3.5
				index_budget 32MiB
				long_output_tokens 2048
				tie_epsilon 2
				output_weight 8
				pair_weight 6
				max_body_bytes 4MB
				profile 127.0.0.1:8001 speculative
				profile 127.0.0.1:8002#1 standard
				fallback round_robin
				state_key chat
				route_id_secret {env.RJ_SECRET}
			}`,
			want: RamjetSelection{PolicySettings: fleetstate.PolicySettings{
				Config: selection.Config{AffinityCap: 8192, Alpha: 0.5, RequestCost: 512, BlockTokens: 32,
					PrefixTokens: 16384, CharsPerToken: 3.5, IndexBudget: 32 << 20, LongOutputTokens: 2048, TieEpsilon: 2, OutputWeight: 8,
					PairWeight: 6, Explicit: selection.ZeroKnobs},
				MaxBodyBytes:  4000000,
				Profiles:      map[string]string{"127.0.0.1:8001": "speculative", "127.0.0.1:8002#1": "standard"},
				FallbackRaw:   json.RawMessage(`{"policy":"round_robin"}`),
				StateKey:      "chat",
				RouteIDSecret: "{env.RJ_SECRET}",
			}},
		},
		{
			name: "fallback with options",
			give: `ramjet {
				fallback header X-User {
					fallback random
				}
			}`,
			want: RamjetSelection{PolicySettings: fleetstate.PolicySettings{FallbackRaw: json.RawMessage(`{"fallback":{"policy":"random"},"field":"X-User","policy":"header"}`)}},
		},
		{name: "argument", give: `ramjet foo`, wantErr: "wrong argument count"},
		{name: "unknown option", give: "ramjet {\n bogus 1\n}", wantErr: "ramjet: unrecognized option 'bogus'"},
		{name: "duplicate", give: "ramjet {\n alpha 1\n alpha 2\n}", wantErr: "ramjet: alpha specified more than once"},
		{name: "missing value", give: "ramjet {\n affinity_cap\n}", wantErr: "affinity_cap: missing value"},
		{name: "too many values", give: "ramjet {\n block_tokens 1 2\n}", wantErr: "block_tokens: too many values"},
		{name: "not an integer", give: "ramjet {\n request_cost lots\n}", wantErr: `request_cost: "lots" is not an integer`},
		{name: "not a number", give: "ramjet {\n alpha high\n}", wantErr: `alpha: "high" is not a number`},
		{name: "not a size", give: "ramjet {\n index_budget big\n}", wantErr: `index_budget: "big" is not a size`},
		{name: "max_body_bytes not a size", give: "ramjet {\n max_body_bytes 1XB\n}", wantErr: "max_body_bytes"},
		{name: "bad profile", give: "ramjet {\n profile a:1 turbo\n}", wantErr: `profile a:1: unknown engine profile "turbo"`},
		{name: "profile missing arg", give: "ramjet {\n profile a:1\n}", wantErr: "profile: want <upstream> speculative|standard"},
		{name: "duplicate profile", give: "ramjet {\n profile a:1 standard\n profile a:1 speculative\n}", wantErr: "profile a:1: specified more than once"},
		{name: "fallback missing", give: "ramjet {\n fallback\n}", wantErr: "fallback: want a policy name"},
		{name: "fallback unknown", give: "ramjet {\n fallback nosuch\n}", wantErr: "fallback:"},
		{name: "fallback self", give: "ramjet {\n fallback ramjet\n}", wantErr: "fallback: ramjet cannot be its own fallback"},
		{name: "duplicate fallback", give: "ramjet {\n fallback random\n fallback first\n}", wantErr: "ramjet: fallback specified more than once"},
		{name: "block on option", give: "ramjet {\n state_key a {\n x\n }\n}", wantErr: "state_key: takes no block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got RamjetSelection
			err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreUnexported(RamjetSelection{}),
				cmp.Transformer("json", func(m json.RawMessage) string { return string(m) })); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestPolicyProvisionDefaults(t *testing.T) {
	p := &RamjetSelection{}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	var want selection.Config
	want.SetDefaults()
	if diff := cmp.Diff(want, p.Config); diff != "" {
		t.Errorf("config defaults (-want +got)\n%s", diff)
	}
	if p.MaxBodyBytes != DefaultMaxBodyBytes || p.StateKey != DefaultStateKey {
		t.Errorf("max_body_bytes %d, state_key %q", p.MaxBodyBytes, p.StateKey)
	}
	if _, ok := p.fallback.(*reverseproxy.LeastConnSelection); !ok {
		t.Errorf("fallback %T, want least_conn", p.fallback)
	}
	if lookupFleet("") != p.fleet || p.fleet == nil {
		t.Error("fleet not registered under the default state key")
	}
}

// TestPolicyValidate: Provision rejects bad settings (each one's check is
// fleetstate.TestPolicySettingsValidate) and an unknown fallback policy.
func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name    string
		give    string // JSON
		wantErr string
	}{
		{name: "ok", give: `{"alpha": 0.5, "profiles": {"a:1": "speculative"}, "state_key": "x"}`},
		{name: "state_key", give: `{"state_key": "a b"}`, wantErr: "state_key must be"},
		{name: "fallback", give: `{"fallback": {"policy": "nosuch"}}`, wantErr: "loading fallback policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p RamjetSelection
			if err := json.Unmarshal([]byte(tt.give), &p); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			err := p.Provision(ctx)
			if err == nil {
				err = p.Validate()
				defer p.Cleanup()
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestPolicyJSONRoundTrip(t *testing.T) {
	// Only exported fields survive Caddyfile -> JSON -> module.
	var p RamjetSelection
	d := caddyfile.NewTestDispenser("ramjet {\n alpha 0.25\n block_tokens 32\n profile a:1 speculative\n state_key s\n}")
	if err := p.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"alpha":0.25,"block_tokens":32,"profiles":{"a:1":"speculative"},"state_key":"s"}`
	if string(b) != want {
		t.Fatalf("JSON\n got %s\nwant %s", b, want)
	}
}

func TestMatcherUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    BodyMatcher
		wantErr string
	}{
		{name: "bare", give: `ramjet_body`, want: BodyMatcher{}},
		{name: "inline", give: `ramjet_body qwen3-* llama-?`, want: BodyMatcher{Models: []string{"qwen3-*", "llama-?"}}},
		{name: "block", give: "ramjet_body {\n model qwen3-*\n model gpt-oss-*\n max_body_bytes 1MiB\n}",
			want: BodyMatcher{Models: []string{"qwen3-*", "gpt-oss-*"}, MaxBodyBytes: 1 << 20}},
		{name: "unknown", give: "ramjet_body {\n modle x\n}", wantErr: "ramjet_body: unrecognized option 'modle'"},
		{name: "model empty", give: "ramjet_body {\n model\n}", wantErr: "model: want at least one glob"},
		{name: "duplicate size", give: "ramjet_body {\n max_body_bytes 1\n max_body_bytes 2\n}", wantErr: "ramjet_body: max_body_bytes specified more than once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got BodyMatcher
			err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestMatcherValidate(t *testing.T) {
	m := BodyMatcher{Models: []string{"qwen3-[a"}}
	if err := m.Validate(); err == nil || !strings.Contains(err.Error(), `models: bad glob "qwen3-[a"`) {
		t.Fatalf("error = %v", err)
	}
}

// TestModuleAndFleetsimDecideAlike runs one request sequence through the
// Caddy module (real Caddy in front of engine simulators on 127.0.0.1) and
// through the fleet simulation's ramjet policy, fed the same request
// bodies (parsed by its router's Extractor, as the module parses them) and
// the same replica keys, and checks that both send every request to the
// same replica. Each request completes (its reservation released) before
// the next, on both sides, so that both decide over the same load.
func TestModuleAndFleetsimDecideAlike(t *testing.T) { moduleAndFleetsimDecideAlike(t, 0) }

// The same with every learn of the module queued (selection's learn queue,
// which the module turns on for long prompts only): the simulation learns
// inline, the decisions are the same.
func TestModuleAndFleetsimDecideAlikeLearnQueued(t *testing.T) {
	moduleAndFleetsimDecideAlike(t, 1)
}

// moduleAndFleetsimDecideAlike is TestModuleAndFleetsimDecideAlike with
// the module's learn queue taking prompts of queueMin blocks and more
// (0: the module's default).
func moduleAndFleetsimDecideAlike(t *testing.T, queueMin int) {
	ss := startSims(t, 4, enginesim.Options{Instant: true})
	dials := ss.dials()
	c := startCaddy(t, dials, proxyOpts{})
	f := lookupFleet("")
	if queueMin > 0 {
		x := f.Base().Index()
		x.SetLearnQueue(queueMin)
		defer func() {
			if q, _ := x.QueuedLearns(); q == 0 {
				t.Error("no learn was queued")
			}
		}()
	}

	sim, err := fleetsim.NewRamjet(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim.UseReplicaKeys(dials)
	replicas := make([]*fleetsim.Replica, len(dials))
	for i := range replicas {
		replicas[i] = &fleetsim.Replica{ID: i}
	}
	feat := sim.Router().Extractor().NewFeatures()

	// Conversations over two shared system prompts, interleaved with cold
	// one-off prompts: affinity, cold placements by rendezvous, and
	// conversations growing turn by turn.
	var bodies []string
	systems := []string{longText("billing", 2500), longText("shipping", 2500)}
	convs := make([][][2]string, 6)
	for turn := range 4 {
		for i := range convs {
			if turn == 0 {
				convs[i] = [][2]string{{"system", systems[i%2]}}
			}
			convs[i] = append(convs[i], [2]string{"user", longText(fmt.Sprintf("conv %d turn %d", i, turn), 200)})
			bodies = append(bodies, chatBody("qwen3-8b", false, convs[i]...))
			convs[i] = append(convs[i], [2]string{"assistant", "noted"})
		}
		bodies = append(bodies, chatBody("qwen3-8b", false, [2]string{"user", longText(fmt.Sprintf("cold %d", turn), 1200)}))
	}

	keyOf := func(id string) string {
		for _, r := range f.replicas() {
			if r.ID == id {
				return r.Key
			}
		}
		return ""
	}
	used := map[string]bool{}
	for i, body := range bodies {
		resp, _ := c.post("/v1/chat/completions", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		got := keyOf(resp.Header.Get(HeaderUpstream))
		eventually(t, "reservations released", func() bool { return totalInflight(f) == 0 && totalPending(f) == 0 })

		if err := sim.Router().Extractor().Parse(selection.EndpointChat, []byte(body), feat); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		rq := &fleetsim.Request{Row: workload.Request{ID: i}}
		rep := sim.PickFeatures(feat, rq, replicas)
		sim.FirstToken(rq, rep)
		sim.Done(rq, rep)

		if got != dials[rep] {
			t.Errorf("request %d: the module chose %q, the simulation %q", i, got, dials[rep])
		}
		used[got] = true
	}
	if len(used) < 2 {
		t.Errorf("every request went to one replica (%v): the sequence tests nothing", used)
	}
	t.Logf("%d requests, %d replicas used, reasons in the simulation %v", len(bodies), len(used), sim.Reasons)
}
