package directive

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/envcheck"
	"github.com/ramjet-llm/ramjet/selection"
)

var updateGolden = flag.Bool("update", false, "rewrite the directive_* golden adapt files")

func TestParseRamjetTokens(t *testing.T) {
	tests := []struct {
		name         string
		give         string
		wantDials    []string
		wantURLs     []string
		wantProfiles []string
		wantKnobs    *selection.Config
		wantErr      string
	}{
		{name: "space separated", give: `ramjet a:8000 b:8001`,
			wantDials: []string{"a:8000", "b:8001"}, wantURLs: []string{"a:8000", "b:8001"}},
		{name: "comma list in one token", give: `ramjet "a:8000, b:8001,c:8002"`,
			wantDials: []string{"a:8000", "b:8001", "c:8002"}},
		{name: "schemes", give: `ramjet http://a:8000/ https://b:9000`,
			wantDials: []string{"a:8000", "b:9000"}, wantURLs: []string{"a:8000", "https://b:9000"}},
		{name: "default port", give: `ramjet http://a`, wantDials: []string{"a:80"}},
		{name: "ranks for all", give: "ramjet a:1,b:2 {\n dp_ranks 2\n}",
			wantDials: []string{"a:1", "a:1", "b:2", "b:2"}},
		{name: "ranks per upstream", give: "ramjet a:1,b:2 {\n dp_ranks 3,1\n}",
			wantDials: []string{"a:1", "a:1", "a:1", "b:2"}},
		{name: "profiles per upstream", give: "ramjet a:1,b:2 {\n profiles standard,speculative\n}",
			wantDials: []string{"a:1", "b:2"}, wantProfiles: []string{"standard", "speculative"}},
		{name: "empty options keep defaults", give: "ramjet a:1 {\n dp_ranks\n profiles\n upstream_token\n alpha\n max_body_size\n}",
			wantDials: []string{"a:1"}, wantProfiles: []string{"standard"}, wantKnobs: &selection.Config{}},
		{name: "knobs", give: "ramjet a:1 {\n affinity_cap 4096\n alpha 0.25\n index_budget 128MiB\n}",
			wantDials: []string{"a:1"}, wantKnobs: &selection.Config{AffinityCap: 4096, Alpha: 0.25, IndexBudget: 128 << 20, Explicit: selection.KnobAlpha}},
		{name: "explicit zeros", give: "ramjet a:1 {\n alpha 0\n request_cost 0\n tie_epsilon 0\n output_weight 0\n pair_weight 0\n}",
			wantDials: []string{"a:1"}, wantKnobs: &selection.Config{Explicit: selection.ZeroKnobs}},
		{name: "reverse_proxy syntax left alone", give: "ramjet a:1 {\n health_interval 1s\n}", wantDials: []string{"a:1"}},
		{name: "empty reverse_proxy options dropped", give: "ramjet a:1 {\n health_interval\n max_fails\n lb_retries 3\n}", wantDials: []string{"a:1"}},

		{name: "no upstream", give: `ramjet`, wantErr: "at least one upstream"},
		{name: "bad scheme", give: `ramjet unix://x`, wantErr: "unsupported scheme"},
		{name: "path", give: `ramjet http://a:1/v1`, wantErr: "without a path"},
		{name: "bad port", give: `ramjet a:99999`, wantErr: "invalid port"},
		{name: "ranks count mismatch", give: "ramjet a:1,b:2,c:3 {\n dp_ranks 1,2\n}", wantErr: "one per upstream"},
		{name: "ranks zero", give: "ramjet a:1 {\n dp_ranks 0\n}", wantErr: "from 1 to 64"},
		{name: "bad profile", give: "ramjet a:1 {\n profiles turbo\n}", wantErr: "standard or speculative"},
		{name: "bad knob", give: "ramjet a:1 {\n alpha lots\n}", wantErr: `alpha: "lots" is not a number`},
		{name: "NaN knob", give: "ramjet a:1 {\n tie_epsilon NaN\n}", wantErr: `tie_epsilon: "NaN" is not a number`},
		{name: "bad int knob", give: "ramjet a:1 {\n request_cost 1.5\n}", wantErr: `request_cost: "1.5" is not an integer`},
		{name: "bad size knob", give: "ramjet a:1 {\n index_budget lots\n}", wantErr: `index_budget: "lots" is not a size`},
		{name: "duplicate", give: "ramjet a:1 {\n alpha 1\n alpha 2\n}", wantErr: "ramjet: alpha specified more than once"},
		{name: "lb_policy refused", give: "ramjet a:1 {\n lb_policy round_robin\n}", wantErr: "ramjet sets lb_policy itself"},
		{name: "to refused", give: "ramjet a:1 {\n to b:2\n}", wantErr: "ramjet sets to itself"},
		{name: "model_check value", give: "ramjet a:1 {\n model_check maybe\n}", wantErr: "model_check: must be on or off"},
		{name: "bad size", give: "ramjet a:1 {\n max_body_size huge\n}", wantErr: "not a size"},
		{name: "bad duration", give: "ramjet a:1 {\n models_cache -1s\n}", wantErr: "not a positive duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rd, err := parseRamjetTokens(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantDials, rd.dials()); diff != "" {
				t.Errorf("dials (-want +got):\n%s", diff)
			}
			if tt.wantURLs != nil {
				if diff := cmp.Diff(tt.wantURLs, rd.baseURLs()); diff != "" {
					t.Errorf("base URLs (-want +got):\n%s", diff)
				}
			}
			if tt.wantProfiles != nil {
				if diff := cmp.Diff(tt.wantProfiles, rd.profiles); diff != "" {
					t.Errorf("profiles (-want +got):\n%s", diff)
				}
			}
			if tt.wantKnobs != nil {
				if diff := cmp.Diff(*tt.wantKnobs, rd.Config); diff != "" {
					t.Errorf("knobs (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// goldenEnv is the environment the golden files are adapted under.
var goldenEnv = map[string]string{
	"RJ_UPSTREAM":          "127.0.0.1:8100,127.0.0.1:8200",
	"RJ_UPSTREAM_DP_RANKS": "",
}

// TestDirectiveAdapt adapts every caddyfile/testdata/directive_*.caddyfiletest
// (a Caddyfile, a line of dashes, the expected JSON) and compares. Run with
// -update to rewrite the expected JSON after an intended change.
func TestDirectiveAdapt(t *testing.T) {
	for k, v := range goldenEnv {
		t.Setenv(k, v)
	}
	files, err := filepath.Glob("../caddyfile/testdata/directive_*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, expected, ok := strings.Cut(string(data), "----------")
			if !ok {
				t.Fatal("no ---------- separator")
			}
			input = strings.TrimSpace(input) + "\n"
			expected = strings.TrimSpace(expected)
			if *updateGolden {
				adapter := caddyconfig.GetAdapter("caddyfile")
				out, _, err := adapter.Adapt([]byte(input), nil)
				if err != nil {
					if !strings.HasPrefix(expected, "{") {
						return // an error case: the expected text is kept
					}
					t.Fatal(err)
				}
				var pretty bytes.Buffer
				if err := json.Indent(&pretty, out, "", "\t"); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(input+"----------\n"+pretty.String()+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if strings.HasPrefix(expected, "{") {
				if !caddytest.CompareAdapt(t, file, input, "caddyfile", expected) {
					t.Errorf("adapting %s differs from the golden JSON", file)
				}
				return
			}
			// Otherwise the expected part is an error substring.
			adapter := caddyconfig.GetAdapter("caddyfile")
			_, _, err = adapter.Adapt([]byte(input), nil)
			if err == nil || !strings.Contains(err.Error(), expected) {
				t.Errorf("adapt error = %v, want %q", err, expected)
			}
		})
	}
}

// TestDeployCaddyfileAdapt adapts deploy/Caddyfile with only RJ_UPSTREAM
// set, compares it with caddyfile/testdata/directive_deploy.json (-update
// rewrites it) and provisions it.
func TestDeployCaddyfileAdapt(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, envcheck.EnvPrefix) {
			t.Setenv(name, "") // the golden file is made with defaults only
		}
	}
	t.Setenv("RJ_UPSTREAM", "127.0.0.1:8100, 127.0.0.1:8200")
	src, err := os.ReadFile("../deploy/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	out, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "deploy/Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warns {
		t.Errorf("adapter warning: %s", w.String())
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	pretty.WriteByte('\n')
	golden := "../caddyfile/testdata/directive_deploy.json"
	if *updateGolden {
		if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), pretty.String()); diff != "" {
		t.Errorf("deploy/Caddyfile adapts differently (-want +got):\n%s", diff)
	}
	for _, secret := range []string{"RJ_UPSTREAM_TOKEN", "RJ_ROUTE_ID_SECRET"} {
		if !strings.Contains(pretty.String(), "{env."+secret+"}") {
			t.Errorf("%s is not read through a runtime placeholder", secret)
		}
	}
	var cfg caddy.Config
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&cfg); err != nil {
		t.Fatalf("provisioning deploy/Caddyfile: %v", err)
	}
}

func TestClosestName(t *testing.T) {
	tests := []struct{ give, want string }{
		{"RJ_ALHPA", "RJ_ALPHA"},
		{"RJ_UPSTREM", "RJ_UPSTREAM"},
		{"RJ_UPSTREAM_TOKENS", "RJ_UPSTREAM_TOKEN"},
		{"RJ_CLIENT_TOKEN", "RJ_CLIENT_TOKENS"},
		{"RJ_COMPLETELY_DIFFERENT", ""},
	}
	for _, tt := range tests {
		if got := envcheck.Closest(tt.give, deployEnvNames); got != tt.want {
			t.Errorf("Closest(%s) = %q, want %q", tt.give, got, tt.want)
		}
	}
	for _, n := range []string{"RJ_UPSTREAM", "RJ_ALPHA", "RJ_LISTEN", "RJ_METRICS_LISTEN", "RJ_UPSTREAM_TOKEN", "RJ_ALLOW_PATHS"} {
		if !deployEnvNames[n] {
			t.Errorf("%s is not among the names read from deploy/Caddyfile", n)
		}
	}
}

// TestParseRamjetPolicyWords checks the directive's "off" words of the
// policy's options (fleetstate.PolicyWords, shared with lb_policy ramjet)
// and that the values reach the policy's settings.
func TestParseRamjetPolicyWords(t *testing.T) {
	tests := []struct {
		give                   string
		band                   int
		indexShare, queueExtra float64
	}{
		{"ramjet a:1 {\n spill_band off\n index_share off\n queue_extra off\n}", -1, -1, -1},
		{"ramjet a:1 {\n spill_band 2048\n index_share 0.5\n queue_extra 3\n}", 2048, 0.5, 3},
		{"ramjet a:1", 0, 0, 0},
	}
	for _, tt := range tests {
		rd, err := parseRamjetTokens(caddyfile.NewTestDispenser(tt.give))
		if err != nil {
			t.Fatalf("%q: %v", tt.give, err)
		}
		p, err := rd.policy()
		if err != nil {
			t.Fatalf("%q: policy: %v", tt.give, err)
		}
		s := p.PolicySettings
		if s.SpillBand != tt.band || s.IndexShare != tt.indexShare || s.QueueExtra != tt.queueExtra {
			t.Errorf("%q: spill_band %d, index_share %v, queue_extra %v; want %d, %v, %v",
				tt.give, s.SpillBand, s.IndexShare, s.QueueExtra, tt.band, tt.indexShare, tt.queueExtra)
		}
	}
	if _, err := parseRamjetTokens(caddyfile.NewTestDispenser("ramjet a:1 {\n queue_extra never\n}")); err == nil {
		t.Error("queue_extra never: accepted, want an error")
	}
}

// TestParseRamjetQueueEstimate: the directive's kv_queue_estimate (the
// precise path's queue rule) reaches the policy's kv settings, off as -1,
// unset as the default (0), and needs kv_events like the other kv options.
func TestParseRamjetQueueEstimate(t *testing.T) {
	const kv = " kv_events 127.0.0.1:1=tcp://127.0.0.1:2\n"
	for _, tt := range []struct {
		give          string
		want, cap, fq float64
	}{
		{"ramjet 127.0.0.1:1 {\n" + kv + " kv_queue_estimate off\n}", -1, 0, 0},
		{"ramjet 127.0.0.1:1 {\n" + kv + " kv_queue_estimate 0.5\n}", 0.5, 0, 0},
		{"ramjet 127.0.0.1:1 {\n" + kv + " kv_queue_estimate\n}", 0, 0, 0},
		{"ramjet 127.0.0.1:1 {\n" + kv + "}", 0, 0, 0},
		{"ramjet 127.0.0.1:1 {\n" + kv + " kv_cap_load off\n}", 0, -1, 0}, // kv_cap_load the same way
		{"ramjet 127.0.0.1:1 {\n" + kv + " kv_cap_load 2\n}", 0, 2, 0},
		{"ramjet 127.0.0.1:1 {\n" + kv + " kv_cap_foreign_queue off\n}", 0, 0, -1}, // kv_cap_foreign_queue too
		{"ramjet 127.0.0.1:1 {\n" + kv + " kv_cap_foreign_queue 6\n}", 0, 0, 6},
	} {
		rd, err := parseRamjetTokens(caddyfile.NewTestDispenser(tt.give))
		if err != nil {
			t.Fatalf("%q: %v", tt.give, err)
		}
		p, err := rd.policy()
		if err != nil {
			t.Fatalf("%q: policy: %v", tt.give, err)
		}
		if p.KV == nil || p.KV.QueueEstimate != tt.want || p.KV.CapLoad != tt.cap || p.KV.CapForeignQueue != tt.fq {
			t.Errorf("%q: kv %+v, want queue_estimate %v, cap_load %v, cap_foreign_queue %v", tt.give, p.KV, tt.want, tt.cap, tt.fq)
		}
	}
	rd, err := parseRamjetTokens(caddyfile.NewTestDispenser("ramjet 127.0.0.1:1 {\n kv_queue_estimate 2\n}"))
	if err == nil {
		_, err = rd.policy()
	}
	if err == nil || !strings.Contains(err.Error(), "kv_events") {
		t.Errorf("kv_queue_estimate without kv_events: %v, want an error naming kv_events", err)
	}
}
