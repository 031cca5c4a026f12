package main

import (
	"context"
	"encoding/json"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

// TestParseTarget checks the ramjet targets' options: fleetsim's keys and
// values (0 or -1 off), the base kept, other names passed through, and
// unknown keys, bad values and options on a non-ramjet policy refused.
func TestParseTarget(t *testing.T) {
	tests := []struct {
		pol, base string
		want      map[string]any
	}{
		{"ramjet", "ramjet", nil},
		{"round_robin", "round_robin", nil},
		{"sglang", "sglang", nil},
		{"ramjet@ixs=-1+qx=-1", "ramjet", map[string]any{"index_share": -1.0, "queue_extra": -1.0}},
		{"ramjet@ixs=0", "ramjet", map[string]any{"index_share": -1.0}},
		{"ramjet-nocap@qx=3", "ramjet-nocap", map[string]any{"queue_extra": 3.0}},
		{"ramjet-precise@ixs=0.8", "ramjet-precise", map[string]any{"index_share": 0.8}},
		{"ramjet@dl=0", "ramjet", map[string]any{"fixed_density": true}},
		{"ramjet-precise@dl=0+ixs=0.8", "ramjet-precise", map[string]any{"fixed_density": true, "index_share": 0.8}},
	}
	for _, tt := range tests {
		base, got, err := parseTarget(tt.pol)
		if err != nil || base != tt.base || !maps.Equal(got, tt.want) {
			t.Errorf("parseTarget(%q) = %q, %v, %v; want %q, %v", tt.pol, base, got, err, tt.base, tt.want)
		}
	}
	for _, bad := range []string{"sglang@ixs=-1", "round_robin@qx=-1", "ramjet@ow=-1", "ramjet@ixs", "ramjet@ixs=x", "ramjet@", "ramjet@dl=1"} {
		if _, _, err := parseTarget(bad); err == nil {
			t.Errorf("parseTarget(%q): no error", bad)
		}
	}
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"-workload", "burst", "-policy", "ramjet,ramjet@bogus=1"}, &out, &errOut); err == nil ||
		!strings.Contains(err.Error(), "bogus") || strings.Contains(errOut.String(), "with ramjet") {
		t.Errorf("run with a bad target: %v (want it refused before the first run)\n%s", err, errOut.String())
	}
}

// TestRamjetTargetReachesCaddy checks that ramjet@ixs=-1+qx=-1 (the
// approximate path before the full-cache model) puts index_share and
// queue_extra -1 in the lb_policy ramjet JSON Caddy loads, beside what
// plain ramjet sets, that those fields decode into the module's settings as
// IndexShare and QueueExtra off, that the real Caddy accepts the site and
// routes through it, and that a value the module refuses fails the load.
func TestRamjetTargetReachesCaddy(t *testing.T) {
	sims, addrs := startCapacityEngines(t)
	const pol = "ramjet@ixs=-1+qx=-1"
	site := siteFor(pol, addrs, sims, 0, SoloInstance)
	plain := siteFor("ramjet", addrs, sims, 0, SoloInstance)
	cfg, err := caddyrun.Config([]caddyrun.Site{site}, map[string]string{"lb": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []json.RawMessage `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfg, &doc); err != nil {
		t.Fatal(err)
	}
	handle := doc.Apps.HTTP.Servers["lb"].Routes[0].Handle
	var proxy struct {
		Handler       string `json:"handler"`
		LoadBalancing struct {
			SelectionPolicy json.RawMessage `json:"selection_policy"`
		} `json:"load_balancing"`
	}
	if err := json.Unmarshal(handle[len(handle)-1], &proxy); err != nil || proxy.Handler != "reverse_proxy" {
		t.Fatalf("last handler %s: %v", handle[len(handle)-1], err)
	}
	var fields map[string]any
	if err := json.Unmarshal(proxy.LoadBalancing.SelectionPolicy, &fields); err != nil {
		t.Fatal(err)
	}
	if fields["policy"] != "ramjet" || fields["index_share"] != -1.0 || fields["queue_extra"] != -1.0 ||
		fields["instance_id"] != SoloInstance || fields["kv_capacity"] != 65536.0 {
		t.Errorf("selection_policy %s", proxy.LoadBalancing.SelectionPolicy)
	}
	if len(fields) != len(plain.PolicyConfig)+3 { // policy, index_share, queue_extra
		t.Errorf("selection_policy %s: want plain ramjet's %v and the two options", proxy.LoadBalancing.SelectionPolicy, plain.PolicyConfig)
	}
	// The module's own decoding (unknown fields refused), as Caddy's of
	// the lb_policy ramjet struct that embeds the settings.
	delete(fields, "policy")
	rest, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	var ps fleetstate.PolicySettings
	if err := json.Unmarshal(rest, &ps); err != nil {
		t.Fatal(err)
	}
	ps.SetDefaults()
	if err := ps.Validate(); err != nil {
		t.Fatal(err)
	}
	if o := ps.SpillOptions(); o.IndexShare != -1 || o.QueueExtra != -1 {
		t.Errorf("module options %+v: want IndexShare and QueueExtra off", o)
	}
	var def fleetstate.PolicySettings
	if o := def.SpillOptions(); o.IndexShare != 0 || o.QueueExtra != 0 {
		t.Errorf("plain ramjet's options %+v: want the defaults (0)", o)
	}
	if selection.DefaultIndexShare <= 0 || selection.DefaultQueueExtra <= 0 {
		t.Fatalf("the defaults are off already (%v, %v): the target changes nothing", selection.DefaultIndexShare, selection.DefaultQueueExtra)
	}

	running, err := caddyrun.Start([]caddyrun.Site{site})
	if err != nil {
		t.Fatal(err)
	}
	client, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: running.URL("lb"), Model: engineModel, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	res := client.Do(context.Background(), []loadgen.Message{{Role: "user", Content: "hello"}}, 4, false)
	client.Close()
	if err := caddyrun.Stop(); err != nil {
		t.Error(err)
	}
	if !res.OK() {
		t.Errorf("request through %s: %+v", pol, res)
	}
	bad := siteFor("ramjet@ixs=2", addrs, sims, 0, SoloInstance)
	if _, err := caddyrun.Start([]caddyrun.Site{bad}); err == nil || !strings.Contains(err.Error(), "index_share") {
		_ = caddyrun.Stop()
		t.Errorf("ramjet@ixs=2 loaded (err %v): the module should refuse index_share 2", err)
	}
}

// TestParseRoutersTarget: -routers-policy takes -policy's options (fleetsim's
// keys and values) on its four bases, and ramjet-precise's always and wait
// flags (the kv block's tokenize_wait) on the precise ones; other bases,
// and the qe key (the kv block's queue_estimate, fleetsim's
// ramjet-precise@qe); other bases,
// flags on a base without kv, unknown keys and bad values are refused,
// before the first run.
func TestParseRoutersTarget(t *testing.T) {
	always := map[string]any{"tokenize_wait": "always"}
	tests := []struct {
		pol, base string
		want      map[string]any
	}{
		{"ramjet", "ramjet", nil},
		{"ramjet-precise-nocap", "ramjet-precise-nocap", nil},
		{"ramjet-precise@always", "ramjet-precise", map[string]any{"kv": always}},
		{"ramjet-precise@warm", "ramjet-precise", map[string]any{"kv": map[string]any{"tokenize_wait": "warm"}}},
		{"ramjet-precise@wait", "ramjet-precise", map[string]any{"kv": map[string]any{"tokenize_wait": "auto"}}},
		{"ramjet-precise-nocap@ixs=-1+always", "ramjet-precise-nocap", map[string]any{"index_share": -1.0, "kv": always}},
		{"ramjet@ixs=0+qx=3", "ramjet", map[string]any{"index_share": -1.0, "queue_extra": 3.0}},
		{"ramjet-nocap@qx=-1", "ramjet-nocap", map[string]any{"queue_extra": -1.0}},
		{"ramjet-precise@qe=0", "ramjet-precise", map[string]any{"kv": map[string]any{"queue_estimate": -1.0}}},
		{"ramjet-precise@always+qe=0.5", "ramjet-precise", map[string]any{"kv": map[string]any{"tokenize_wait": "always", "queue_estimate": 0.5}}},
		{"ramjet-precise@capl=0", "ramjet-precise", map[string]any{"kv": map[string]any{"cap_load": -1.0}}},
		{"ramjet-precise@capfq=0", "ramjet-precise", map[string]any{"kv": map[string]any{"cap_foreign_queue": -1.0}}},
		{"ramjet-precise@capl=3+capm=0", "ramjet-precise", map[string]any{"kv": map[string]any{"cap_load": 3.0, "cap_peer": -1.0}}},
		{"ramjet-precise@capl=3+capm=1.1+capg=1", "ramjet-precise", map[string]any{"kv": map[string]any{"cap_load": 3.0, "cap_peer": 1.1, "cap_gain": 1.0}}},
		// the lift stack spelled out (the module's default since 2026-12-07), and capgf off.
		{"ramjet-precise@capl=3+capm=1.1+capgf=0.75+capfit=2.5", "ramjet-precise", map[string]any{"kv": map[string]any{"cap_load": 3.0, "cap_peer": 1.1, "cap_gain": 0.75, "cap_gain_fleet": true, "cap_fit": 2.5}}},
		{"ramjet-precise@capgf=0", "ramjet-precise", map[string]any{"kv": map[string]any{"cap_gain": -1.0, "cap_gain_fleet": true}}},
		// fleetsim's ramjet-precise@noqx: queue_extra off, as ramjet-precise@qx=-1.
		{"ramjet-precise@noqx", "ramjet-precise", map[string]any{"queue_extra": -1.0}},
		{"ramjet-precise-nocap@noqx+always", "ramjet-precise-nocap", map[string]any{"queue_extra": -1.0, "kv": always}},
	}
	for _, tt := range tests {
		base, got, err := parseRoutersTarget(tt.pol)
		if err != nil || base != tt.base || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseRoutersTarget(%q) = %q, %v, %v; want %q, %v", tt.pol, base, got, err, tt.base, tt.want)
		}
	}
	for _, bad := range []string{"sglang", "round_robin", "ramjet@always", "ramjet-nocap@wait", "ramjet-precise@always=1",
		"ramjet-precise@bogus", "ramjet@ixs=x", "sglang@ixs=-1", "ramjet@noqx", "ramjet-precise@noqx=1", "ramjet-precise@", "ramjet@qe=1", "ramjet-precise@qe", "ramjet@capl=3"} {
		if _, _, err := parseRoutersTarget(bad); err == nil {
			t.Errorf("parseRoutersTarget(%q): no error", bad)
		}
	}
	// -policy takes the flags too.
	if base, got, err := parseTarget("ramjet-precise@always"); err != nil || base != "ramjet-precise" || !reflect.DeepEqual(got, map[string]any{"kv": always}) {
		t.Errorf("parseTarget(ramjet-precise@always) = %q, %v, %v", base, got, err)
	}
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"-workload", "burst", "-policy", "", "-routers", "2", "-routers-policy", "ramjet,ramjet@always"}, &out, &errOut); err == nil ||
		!strings.Contains(err.Error(), "always") || strings.Contains(errOut.String(), "instances behind") {
		t.Errorf("run with a bad -routers-policy: %v (want it refused before the first run)\n%s", err, errOut.String())
	}
}

// TestRoutersTargetReachesCaddy: a -routers-policy target's options reach
// every instance's lb_policy ramjet (ramjet-precise@always+ixs=-1+qe=0:
// index_share -1 beside the kv block's engines, tokenize_wait always,
// queue_estimate -1), without changing the kv block the instances share;
// the kv block decodes into the module's settings as the wait rule and the
// queue rule off; the real Caddy loads
// every instance and routes a request through each; the row's policy is
// the target's name.
func TestRoutersTargetReachesCaddy(t *testing.T) {
	sims, addrs := startCapacityEngines(t)
	const pol = "ramjet-precise@always+ixs=-1+qe=0"
	base, settings, err := parseRoutersTarget(pol)
	if err != nil || base != "ramjet-precise" {
		t.Fatalf("parseRoutersTarget: %q, %v", base, err)
	}
	sites, name := multiSitesFor(2, sims, addrs, multiOpts{precise: true, name: pol, settings: settings})
	if name != pol || len(sites) != 2 {
		t.Fatalf("policy %q with %d sites, want %q with 2", name, len(sites), pol)
	}
	plain, _ := multiSitesFor(2, sims, addrs, multiOpts{precise: true})
	for i, s := range sites {
		kv, _ := s.PolicyConfig["kv"].(map[string]any)
		if s.PolicyConfig["index_share"] != -1.0 || kv["tokenize_wait"] != "always" || kv["queue_estimate"] != -1.0 || kv["engines"] == nil {
			t.Errorf("%s: policy config %v", s.Name, s.PolicyConfig)
		}
		if len(s.PolicyConfig) != len(plain[i].PolicyConfig)+1 { // index_share
			t.Errorf("%s: %v, want plain ramjet-precise's %v and index_share", s.Name, s.PolicyConfig, plain[i].PolicyConfig)
		}
		if _, ok := plain[i].PolicyConfig["kv"].(map[string]any)["tokenize_wait"]; ok {
			t.Errorf("plain %s: tokenize_wait set", plain[i].Name)
		}
		b, err := json.Marshal(kv)
		if err != nil {
			t.Fatal(err)
		}
		var ks kvindex.Settings
		if err := json.Unmarshal(b, &ks); err != nil {
			t.Fatal(err)
		}
		ks.SetDefaults()
		if err := ks.Validate(); err != nil {
			t.Fatal(err)
		}
		pc, err := ks.Precise("", "", nil, nil)
		if err != nil || pc.WaitAuto || pc.QueueEstimate != -1 {
			t.Errorf("%s: the module's precise config: wait rule %v, queue rule %v, err %v; want both off", s.Name, pc.WaitAuto, pc.QueueEstimate, err)
		}
	}
	helloThroughEach(t, sites, pol)
}
