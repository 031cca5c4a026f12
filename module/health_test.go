package module

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ramjet-llm/ramjet/fleetstate"
)

// toggleEngine is a real HTTP engine whose /v1/models can be made to fail.
type toggleEngine struct {
	*httptest.Server
	down atomic.Bool
}

func startToggleEngine(t *testing.T) *toggleEngine {
	t.Helper()
	e := &toggleEngine{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, `{"data":[{"id":"m"}]}`)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *toggleEngine) dial() string { return strings.TrimPrefix(e.URL, "http://") }

func TestHealthReportsCaddyUpstreamState(t *testing.T) {
	e1, e2 := startToggleEngine(t), startToggleEngine(t)
	addr := listenLocal(t)
	dials := []string{e1.dial(), e1.dial(), e2.dial()} // e1 has two ranks
	ups := []map[string]any{{"dial": dials[0]}, {"dial": dials[1]}, {"dial": dials[2]}}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"s": map[string]any{
			"listen":          []string{caddyAddr(addr)},
			"automatic_https": map[string]any{"disable": true},
			"routes": []any{
				map[string]any{
					"match":  []any{map[string]any{"path": []string{"/health"}}},
					"handle": []any{map[string]any{"handler": "ramjet_health", "upstreams": dials, "route_id_secret": "k"}},
				},
				map[string]any{"handle": []any{map[string]any{"handler": "subroute", "routes": []any{
					map[string]any{"handle": []any{map[string]any{
						"handler":   "reverse_proxy",
						"upstreams": ups,
						"health_checks": map[string]any{
							"active":  map[string]any{"uri": "/v1/models", "interval": "50ms", "timeout": "5s", "fails": 2}, // a stall is not a failed check
							"passive": map[string]any{"fail_duration": "1m", "max_fails": 1},
						},
					}}},
				}}}},
			},
		}}}},
	}
	b, _ := json.Marshal(cfg)
	if err := caddy.Load(b, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopCaddy(t) })

	get := func() (int, fleetstate.HealthReport) {
		st, rep, body := readHealth(t, "http://"+addr+"/health")
		if strings.Contains(body, "127.0.0.1") {
			t.Errorf("/health leaks an address: %s", body)
		}
		return st, rep
	}
	wait := func(status string, code int) fleetstate.HealthReport {
		t.Helper()
		var st int
		var rep fleetstate.HealthReport
		if !poll(20*time.Second, func() bool { st, rep = get(); return st == code && rep.Status == status }) {
			t.Fatalf("health stayed %d %+v, want %d %s", st, rep, code, status)
		}
		return rep
	}

	rep := wait(fleetstate.StatusOK, 200)
	wantIDs := fleetstate.ReplicaIDs([]byte("k"), dials)
	for i, r := range rep.Replicas {
		if r.ID != wantIDs[i] || !r.Healthy {
			t.Errorf("replica %d = %+v, want id %s", i, r, wantIDs[i])
		}
	}
	if wantIDs[0] == wantIDs[1] {
		t.Error("two ranks of one engine share an id")
	}

	e2.down.Store(true)
	rep = wait(fleetstate.StatusDegraded, 200)
	if rep.Healthy != 2 || rep.Replicas[2].Reason != "active_check" {
		t.Errorf("degraded = %+v", rep)
	}
	e1.down.Store(true)
	wait(fleetstate.StatusUnhealthy, 503)
	e1.down.Store(false)
	e2.down.Store(false)
	wait(fleetstate.StatusOK, 200)
}

func TestHealthWithoutProxy(t *testing.T) {
	h := &Health{Upstreams: []string{"127.0.0.1:1"}}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	rep := h.Report()
	if rep.Status != fleetstate.StatusUnhealthy || rep.Replicas[0].Reason != "not_found" {
		t.Errorf("report = %+v", rep)
	}
}
