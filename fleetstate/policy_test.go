package fleetstate

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/snapshot"
)

func TestPolicySettingsDefaults(t *testing.T) {
	var got PolicySettings
	got.SetDefaults()
	want := PolicySettings{MaxBodyBytes: DefaultMaxBodyBytes, StateKey: DefaultStateKey, DepartAfter: duration.Duration(DefaultDepartAfter)}
	want.Config.SetDefaults()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got)\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
	if got := got.OutlierConfig(); got != (selection.OutlierSettings{}).Config() {
		t.Errorf("outlier config without outlier %+v, want the defaults", got)
	}
}

func TestPolicySettingsValidate(t *testing.T) {
	tests := []struct {
		name    string
		give    string // JSON
		wantErr string
	}{
		{name: "ok", give: `{"alpha": 0.5, "profiles": {"a:1": "speculative", "b:1": "Standard"}, "state_key": "x.y-z_1"}`},
		{name: "affinity_cap", give: `{"affinity_cap": -1}`, wantErr: "affinity_cap must be positive"},
		{name: "alpha", give: `{"alpha": -2}`, wantErr: "alpha must be"},
		{name: "request_cost", give: `{"request_cost": -1}`, wantErr: "request_cost must be"},
		{name: "block_tokens", give: `{"block_tokens": -64}`, wantErr: "block_tokens must be positive"},
		{name: "prefix_tokens", give: `{"prefix_tokens": 16, "block_tokens": 64}`, wantErr: "prefix_tokens must be at least block_tokens"},
		{name: "chars_per_token", give: `{"chars_per_token": 100}`, wantErr: "chars_per_token must be between"},
		{name: "index_budget", give: `{"index_budget": 100}`, wantErr: "index_budget must be at least"},
		{name: "long_output_tokens", give: `{"long_output_tokens": -5}`, wantErr: "long_output_tokens must be positive"},
		{name: "tie_epsilon", give: `{"tie_epsilon": -1}`, wantErr: "tie_epsilon must be"},
		{name: "output_weight", give: `{"output_weight": -1}`, wantErr: "output_weight must be"},
		{name: "max_body_bytes", give: `{"max_body_bytes": -1}`, wantErr: "max_body_bytes must be positive"},
		{name: "profiles", give: `{"profiles": {"a:1": "fast"}}`, wantErr: `profiles[a:1]: unknown engine profile "fast"`},
		{name: "state_key", give: `{"state_key": "a b"}`, wantErr: "state_key must be 1-64 letters"},
		{name: "state_key too long", give: `{"state_key": "` + strings.Repeat("k", 65) + `"}`, wantErr: "state_key must be"},
		{name: "outlier", give: `{"outlier": {"base_ejection": "1m", "max_ejection": "1s"}}`, wantErr: "max_ejection"},
		{name: "depart_after", give: `{"depart_after": "-1s"}`, wantErr: "depart_after must be positive, got -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s PolicySettings
			if err := json.Unmarshal([]byte(tt.give), &s); err != nil {
				t.Fatal(err)
			}
			s.SetDefaults()
			err := s.Validate()
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

func TestPolicySettingsProfiles(t *testing.T) {
	s := PolicySettings{Profiles: map[string]string{"a:1": "speculative", "b:1#0": "STANDARD", "c:1": ""}}
	want := map[string]selection.Profile{"a:1": selection.ProfileSpeculative, "b:1#0": selection.ProfileStandard, "c:1": selection.ProfileStandard}
	if diff := cmp.Diff(want, s.ProfileMap()); diff != "" {
		t.Errorf("profiles (-want +got)\n%s", diff)
	}
	if _, ok := ParseProfile("turbo"); ok {
		t.Error("ParseProfile accepted turbo")
	}
}

// TestPolicySettingsJSON: the JSON names and their order are the policy's
// (the Caddyfile goldens are byte-identical through them).
func TestPolicySettingsJSON(t *testing.T) {
	s := PolicySettings{Config: selection.Config{Alpha: 0.5, Explicit: selection.KnobAlpha}, MaxBodyBytes: 1, Profiles: map[string]string{"a:1": "speculative"},
		FallbackRaw: json.RawMessage(`{"policy":"random"}`), StateKey: "s", RouteIDSecret: "r", InstanceID: "i",
		Outlier: &selection.OutlierSettings{}, Snapshot: &snapshot.Settings{Path: "/p", Interval: duration.Duration(time.Second)},
		DepartAfter: duration.Duration(time.Minute)}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"alpha":0.5,"max_body_bytes":1,"profiles":{"a:1":"speculative"},"fallback":{"policy":"random"},"state_key":"s",` +
		`"route_id_secret":"r","instance_id":"i","outlier":{},"snapshot":{"path":"/p","interval":1000000000},"depart_after":60000000000}`
	if string(b) != want {
		t.Errorf("JSON\n got %s\nwant %s", b, want)
	}
	var back PolicySettings
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(s, back, cmp.Transformer("json", func(m json.RawMessage) string { return string(m) })); diff != "" {
		t.Errorf("round trip (-want +got)\n%s", diff)
	}
}

// TestPolicySettingsExplicitKnobs: a knob whose zero is a value is marked
// explicit when the JSON has it, and its zero is written out again.
func TestPolicySettingsExplicitKnobs(t *testing.T) {
	tests := []struct {
		give    string
		want    selection.Knobs
		wantErr string
	}{
		{give: `{}`},
		{give: `{"alpha":0}`, want: selection.KnobAlpha},
		{give: `{"alpha":null,"affinity_cap":0}`},
		{give: `{"request_cost":0,"tie_epsilon":0,"output_weight":0,"pair_weight":0,"alpha":2}`, want: selection.ZeroKnobs},
		{give: `{"alpah":0}`, wantErr: "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			var s PolicySettings
			err := json.Unmarshal([]byte(tt.give), &s)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Explicit != tt.want {
				t.Errorf("explicit = %b, want %b", s.Explicit, tt.want)
			}
			b, err := json.Marshal(&s)
			if err != nil {
				t.Fatal(err)
			}
			var back PolicySettings
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if back.Explicit != tt.want || back.Config != s.Config {
				t.Errorf("round trip %s: %+v, want %+v", b, back.Config, s.Config)
			}
		})
	}
}
