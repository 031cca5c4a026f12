// Package caddyrun runs a real Caddy in-process in front of engines, one
// listener per load-balancing policy, for the load generator's tests, the
// overhead benchmark and the end-to-end comparison. It imports Caddy's
// standard modules and ramjet's module package, so that "ramjet" is a
// selection policy like round_robin and least_conn.
//
// Caddy keeps one running configuration per process: Start replaces it
// and Stop unloads it. Callers must not run two at once.
package caddyrun

import (
	"encoding/json"
	"fmt"
	"net"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard" // reverse_proxy and its policies

	_ "github.com/ramjet-llm/ramjet/module" // the ramjet policy and handlers
)

// SpreadHeader is the response header every Site sets to the dial address
// of the upstream that served the request, whatever its policy, so that
// replica spread can be compared across policies. (ramjet's own
// X-Ramjet-Upstream is an opaque id that only ramjet sets.)
const SpreadHeader = "X-Loadgen-Upstream"

// Site is one listener proxying to a set of upstreams with one policy.
type Site struct {
	// Name identifies the site (its Caddy server name).
	Name string
	// Policy is the selection policy's module name: round_robin,
	// least_conn, ramjet...
	Policy string
	// PolicyConfig holds extra JSON fields of the policy (nil: defaults).
	PolicyConfig map[string]any
	// Upstreams are the engines' dial addresses (host:port).
	Upstreams []string
	// Handlers are extra handlers placed before reverse_proxy (raw JSON
	// objects with a "handler" field), e.g. the ramjet body handler.
	Handlers []map[string]any
}

// Running is a loaded Caddy configuration.
type Running struct {
	// Addr maps each site's name to its listen address (127.0.0.1:port).
	Addr map[string]string
}

// URL returns the OpenAI base URL of the named site.
func (r *Running) URL(site string) string { return "http://" + r.Addr[site] + "/v1" }

// Config builds the Caddy JSON configuration for sites on the given
// listen addresses.
func Config(sites []Site, addrs map[string]string) ([]byte, error) {
	servers := make(map[string]any, len(sites))
	for _, s := range sites {
		if s.Name == "" || s.Policy == "" || len(s.Upstreams) == 0 {
			return nil, fmt.Errorf("site %q: name, policy and upstreams are required", s.Name)
		}
		ups := make([]map[string]any, len(s.Upstreams))
		for i, u := range s.Upstreams {
			ups[i] = map[string]any{"dial": u}
		}
		policy := map[string]any{"policy": s.Policy}
		for k, v := range s.PolicyConfig {
			policy[k] = v
		}
		proxy := map[string]any{
			"handler":        "reverse_proxy",
			"upstreams":      ups,
			"load_balancing": map[string]any{"selection_policy": policy},
			"flush_interval": -1,
			"headers": map[string]any{
				"response": map[string]any{
					"set": map[string]any{SpreadHeader: []string{"{http.reverse_proxy.upstream.hostport}"}},
				},
			},
		}
		handle := make([]any, 0, len(s.Handlers)+1)
		for _, h := range s.Handlers {
			handle = append(handle, h)
		}
		handle = append(handle, proxy)
		servers[s.Name] = map[string]any{
			"listen":          []string{addrs[s.Name]},
			"routes":          []any{map[string]any{"handle": handle}},
			"automatic_https": map[string]any{"disable": true},
		}
	}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps":    map[string]any{"http": map[string]any{"servers": servers}},
	}
	return json.Marshal(cfg)
}

// Start loads a Caddy configuration with one listener per site on free
// 127.0.0.1 ports and waits until every listener accepts connections.
func Start(sites []Site) (*Running, error) {
	addrs := make(map[string]string, len(sites))
	for _, s := range sites {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		addrs[s.Name] = a
	}
	cfg, err := Config(sites, addrs)
	if err != nil {
		return nil, err
	}
	if err := caddy.Load(cfg, true); err != nil {
		return nil, fmt.Errorf("load caddy config: %w", err)
	}
	for _, a := range addrs {
		if err := waitListening(a, 5*time.Second); err != nil {
			_ = caddy.Stop()
			return nil, err
		}
	}
	return &Running{Addr: addrs}, nil
}

// Stop unloads the running configuration, closing its listeners.
func Stop() error { return caddy.Stop() }

// freeAddr reserves a free loopback port by listening and closing.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("reserve port: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

func waitListening(addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("caddy listener %s not up: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RamjetSite is a site with the given policy; for "ramjet" it adds the
// ramjet handler (http.handlers.ramjet_observe) in front of reverse_proxy, as the
// ramjet_observe directive does, so that reservations are released at
// stream end and prefill completion is observed. It is the one place that
// knows how ramjet is configured.
func RamjetSite(name, policy string, upstreams []string) Site {
	s := Site{Name: name, Policy: policy, Upstreams: upstreams}
	if policy == "ramjet" {
		s.Handlers = []map[string]any{{"handler": "ramjet_observe"}}
	}
	return s
}
