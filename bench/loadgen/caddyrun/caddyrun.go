package caddyrun

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
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
// listen addresses (Caddy network addresses).
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

// Start binds one 127.0.0.1 listener per site (port chosen by the
// kernel), hands them to Caddy and loads a configuration serving the sites
// on them. No port is reserved, closed and rebound: Caddy serves on the
// very sockets Start bound, so every listener accepts connections when
// Start returns.
func Start(sites []Site) (*Running, error) {
	addrs := make(map[string]string, len(sites))
	listen := make(map[string]string, len(sites))
	var bound []string
	release := func() {
		for _, a := range bound {
			if ln, ok := handover.LoadAndDelete(a); ok {
				ln.(net.Listener).Close()
			}
		}
	}
	for _, s := range sites {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			release()
			return nil, fmt.Errorf("listen for site %q: %w", s.Name, err)
		}
		a := ln.Addr().String()
		handover.Store(a, ln)
		bound = append(bound, a)
		addrs[s.Name] = a
		listen[s.Name] = network + "/" + a
	}
	cfg, err := Config(sites, listen)
	if err != nil {
		release()
		return nil, err
	}
	if err := caddy.Load(cfg, true); err != nil {
		release()
		return nil, fmt.Errorf("load caddy config: %w", err)
	}
	release() // anything Caddy did not take
	return &Running{Addr: addrs}, nil
}

// Stop unloads the running configuration, closing its listeners, and
// waits up to 10s for the servers' connections to close (caddy.Stop
// returns while its servers still drain in the background).
func Stop() error {
	err := caddy.Stop()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for openConns.Load() > 0 && time.Now().Before(deadline) {
		<-tick.C
	}
	if n := openConns.Load(); n > 0 && err == nil {
		err = fmt.Errorf("caddy stopped with %d connections still open after 10s", n)
	}
	return err
}

// LoadOn loads cfg, a Caddy JSON config (such as an adapted Caddyfile),
// serving on lns instead of binding its own sockets: every server listen
// address and the admin listen address whose port is that of one of lns
// is rewritten to that listener. LoadOn owns lns: Caddy closes those it
// took at Stop, LoadOn closes the others before it returns.
func LoadOn(cfg []byte, lns ...net.Listener) error {
	byPort := make(map[string]string, len(lns))
	for _, ln := range lns {
		a := ln.Addr().String()
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			return err
		}
		handover.Store(a, ln)
		byPort[port] = a
	}
	defer func() {
		for _, a := range byPort {
			if ln, ok := handover.LoadAndDelete(a); ok {
				ln.(net.Listener).Close()
			}
		}
	}()
	swap := func(s string) string {
		na, err := caddy.ParseNetworkAddress(s)
		if err != nil || na.IsUnixNetwork() || na.StartPort != na.EndPort {
			return s
		}
		if a, ok := byPort[strconv.FormatUint(uint64(na.StartPort), 10)]; ok {
			return network + "/" + a
		}
		return s
	}
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		return fmt.Errorf("decoding the config: %w", err)
	}
	if admin, ok := m["admin"].(map[string]any); ok {
		if l, ok := admin["listen"].(string); ok {
			admin["listen"] = swap(l)
		}
	}
	apps, _ := m["apps"].(map[string]any)
	httpApp, _ := apps["http"].(map[string]any)
	servers, _ := httpApp["servers"].(map[string]any)
	for _, srv := range servers {
		srv, _ := srv.(map[string]any)
		ls, _ := srv["listen"].([]any)
		for i, l := range ls {
			if l, ok := l.(string); ok {
				ls[i] = swap(l)
			}
		}
	}
	cfg, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := caddy.Load(cfg, true); err != nil {
		return fmt.Errorf("load caddy config: %w", err)
	}
	return nil
}

// network is the Caddy network type of the listeners Start hands over:
// Caddy asked to listen on "caddyrun/127.0.0.1:PORT" takes the listener
// Start bound there (caddy.RegisterNetwork).
const network = "caddyrun"

func init() { caddy.RegisterNetwork(network, takeListener) }

// handover holds the listeners Start bound and Caddy has not taken yet,
// by address.
var handover sync.Map

// openConns counts the connections accepted on handed-over listeners and
// not closed yet.
var openConns atomic.Int64

func takeListener(_ context.Context, _, host, port string, _ uint, _ net.ListenConfig) (any, error) {
	ln, ok := handover.LoadAndDelete(net.JoinHostPort(host, port))
	if !ok {
		return nil, fmt.Errorf("caddyrun: no listener bound on %s (one Start per configuration)", net.JoinHostPort(host, port))
	}
	return countingListener{ln.(net.Listener)}, nil
}

// countingListener counts its connections in openConns.
type countingListener struct{ net.Listener }

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	openConns.Add(1)
	return &countedConn{Conn: c}, nil
}

type countedConn struct {
	net.Conn
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { openConns.Add(-1) })
	return c.Conn.Close()
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

// GuardedRamjetSite is RamjetSite with the guard (http.handlers.ramjet_guard:
// one bounded read and parse of the body, shared with the policy) ahead of
// the observer. deploy/Caddyfile's ramjet directive emits the observer
// first, then the guard; the two share one response writer either way
// (module/guard.go, handler.go), so both orders do the same work per
// request, and this one keeps the overhead series comparable across
// sessions. The guard scrubs response
// headers that carry an upstream address, SpreadHeader included: count
// replicas by X-Ramjet-Upstream on such a site.
func GuardedRamjetSite(name, policy string, upstreams []string) Site {
	s := RamjetSite(name, policy, upstreams)
	if policy == "ramjet" {
		s.Handlers = append([]map[string]any{{"handler": "ramjet_guard", "upstreams": upstreams}}, s.Handlers...)
	}
	return s
}
