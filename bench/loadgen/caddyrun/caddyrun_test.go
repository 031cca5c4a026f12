package caddyrun

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestConfig(t *testing.T) {
	sites := []Site{
		{Name: "rr", Policy: "round_robin", Upstreams: []string{"127.0.0.1:1", "127.0.0.1:2"}},
		RamjetSite("rj", "ramjet", []string{"127.0.0.1:1"}),
	}
	raw, err := Config(sites, map[string]string{"rr": "127.0.0.1:9001", "rj": "127.0.0.1:9002"})
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Admin struct {
			Disabled bool `json:"disabled"`
		} `json:"admin"`
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen []string `json:"listen"`
					Routes []struct {
						Handle []map[string]any `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if !cfg.Admin.Disabled {
		t.Error("admin endpoint enabled: parallel test binaries would fight over it")
	}
	handlers := func(name string) []string {
		var out []string
		for _, h := range cfg.Apps.HTTP.Servers[name].Routes[0].Handle {
			out = append(out, h["handler"].(string))
		}
		return out
	}
	if diff := cmp.Diff([]string{"reverse_proxy"}, handlers("rr")); diff != "" {
		t.Errorf("rr handlers (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"ramjet_observe", "reverse_proxy"}, handlers("rj")); diff != "" {
		t.Errorf("ramjet handlers (-want +got):\n%s", diff)
	}
	if got := cfg.Apps.HTTP.Servers["rj"].Listen; len(got) != 1 || got[0] != "127.0.0.1:9002" {
		t.Errorf("rj listens on %v", got)
	}
	if !strings.Contains(string(raw), `"X-Loadgen-Upstream":["{http.reverse_proxy.upstream.hostport}"]`) {
		t.Errorf("no spread header in %s", raw)
	}
	if _, err := Config([]Site{{Name: "x", Policy: "round_robin"}}, nil); err == nil {
		t.Error("a site without upstreams was accepted")
	}
}
