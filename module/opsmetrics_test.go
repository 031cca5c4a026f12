package module

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestOpsMetricsNoAddresses: the ops port of deploy/Caddyfile serves the
// ramjet series by route id and no series naming an engine address
// (Caddy's caddy_reverse_proxy_upstreams_healthy{upstream="<dial>"}).
// Issue 15, item 4.
func TestOpsMetricsNoAddresses(t *testing.T) {
	ss := startSims(t, 2, enginesim.Options{})
	p := mustLoad(t, deployCaddyfile(t), map[string]string{"RJ_UPSTREAM": strings.Join(ss.dials(), ",")})
	if err := streamOnce(t.Context(), http.DefaultClient, p.base, ss[0].Model(), "ops metrics"); err != nil {
		t.Fatal(err)
	}
	var body string
	eventually(t, "the replicas' ramjet_upstream_healthy series", func() bool {
		resp, err := http.Get(p.metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == http.StatusOK && strings.Count(body, "\nramjet_upstream_healthy{") == 2
	})
	for _, d := range ss.dials() {
		if strings.Contains(body, d) {
			t.Errorf("the ops port's metrics name engine address %s:\n%s", d, grepLines(body, d))
		}
	}
	if strings.Contains(body, "caddy_reverse_proxy_") {
		t.Errorf("the ops port serves Caddy's reverse-proxy series:\n%s", grepLines(body, "caddy_reverse_proxy_"))
	}
	for _, want := range []string{"caddy_config_last_reload_successful", "go_goroutines", "process_open_fds"} {
		if !strings.Contains(body, want) {
			t.Errorf("the ops port lost %s", want)
		}
	}
}

func TestOpsMetricsUnmarshalCaddyfile(t *testing.T) {
	for _, tt := range []struct {
		name, give, wantErr string
		want                bool
	}{
		{"bare", "ramjet_metrics", "", false},
		{"openmetrics off", "ramjet_metrics {\n disable_openmetrics\n}", "", true},
		{"argument", "ramjet_metrics x", "wrong argument count", false},
		{"unknown option", "ramjet_metrics {\n nope\n}", `ramjet_metrics: unrecognized option 'nope'`, false},
		{"option argument", "ramjet_metrics {\n disable_openmetrics yes\n}", `disable_openmetrics: "yes" is not a boolean`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var m OpsMetrics
			err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || m.DisableOpenMetrics != tt.want {
				t.Fatalf("got %+v, %v; want DisableOpenMetrics %v", m, err, tt.want)
			}
		})
	}
}
