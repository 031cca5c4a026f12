package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// freeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago (Caddy binds it itself).
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// proxyOpts shapes the Caddy config of an end-to-end test.
type proxyOpts struct {
	// Policy is the lb_policy JSON object (without "policy"); nil means {}.
	Policy map[string]any
	// Health enables active health checks on /health every 50ms.
	Health bool
	// Retries sets load_balancing.retries.
	Retries int
	// NoHandler leaves out the ramjet handler (policy only).
	NoHandler bool
	// Matcher adds a ramjet_body matcher with these model globs on the
	// proxy route; requests that do not match get a 404.
	Matcher []string
	// Extra is a response header the route sets, to make configs differ.
	Extra string
	// HeaderUp adds a header_up operation (X-Test-Up: 1) to the proxy, so
	// that Caddy rebuilds request headers on every attempt.
	HeaderUp bool
	// NoKeepAlive makes the proxy dial every request anew, so that an
	// engine refusing connections fails at dial time (never on a pooled
	// connection it just closed, which Caddy does not retry for a POST).
	NoKeepAlive bool
}

// testCaddy is a Caddy instance run in-process on 127.0.0.1.
type testCaddy struct {
	t     testing.TB
	addr  string // client address
	admin string // admin address
	ups   []string
}

// startCaddy loads a config proxying to ups (dial addresses) and stops
// Caddy when the test ends.
func startCaddy(t testing.TB, ups []string, o proxyOpts) *testCaddy {
	t.Helper()
	c := &testCaddy{t: t, addr: freeAddr(t), admin: freeAddr(t), ups: ups}
	if err := caddy.Load(c.config(o), true); err != nil {
		t.Fatalf("loading caddy config: %v", err)
	}
	t.Cleanup(func() {
		// Idle client connections would hold up the server's shutdown.
		http.DefaultClient.CloseIdleConnections()
		// An empty config with the admin endpoint disabled stops the
		// servers and the admin endpoint; Stop alone keeps the latter.
		if err := caddy.Load([]byte(`{"admin":{"disabled":true}}`), true); err != nil {
			t.Errorf("unloading caddy: %v", err)
		}
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
	})
	c.waitReady()
	return c
}

func (c *testCaddy) config(o proxyOpts) []byte {
	pol := map[string]any{"policy": "ramjet"}
	for k, v := range o.Policy {
		pol[k] = v
	}
	var upstreams []map[string]any
	for _, u := range c.ups {
		upstreams = append(upstreams, map[string]any{"dial": u})
	}
	lb := map[string]any{"selection_policy": pol}
	if o.Retries > 0 {
		lb["retries"] = o.Retries
	}
	proxy := map[string]any{
		"handler":        "reverse_proxy",
		"upstreams":      upstreams,
		"load_balancing": lb,
		"flush_interval": -1,
	}
	if o.NoKeepAlive {
		proxy["transport"] = map[string]any{"protocol": "http", "keep_alive": map[string]any{"enabled": false}}
	}
	if o.HeaderUp {
		proxy["headers"] = map[string]any{"request": map[string]any{"set": map[string]any{"X-Test-Up": []string{"1"}}}}
	}
	if o.Health {
		proxy["health_checks"] = map[string]any{"active": map[string]any{
			"uri": "/health", "interval": "50ms", "timeout": "1s", "fails": 1, "passes": 1,
		}}
	}
	var handlers []any
	if o.Extra != "" {
		handlers = append(handlers, map[string]any{"handler": "headers",
			"response": map[string]any{"set": map[string]any{"X-Test-Config": []string{o.Extra}}}})
	}
	if !o.NoHandler {
		handlers = append(handlers, map[string]any{"handler": "ramjet_observe"})
	}
	handlers = append(handlers, proxy)
	route := map[string]any{"handle": handlers}
	routes := []any{route}
	if o.Matcher != nil {
		route["match"] = []any{map[string]any{"ramjet_body": map[string]any{"models": o.Matcher}}}
		routes = append(routes, map[string]any{"handle": []any{map[string]any{
			"handler": "static_response", "status_code": 404, "body": "no match"}}})
	}
	cfg := map[string]any{
		"admin":   map[string]any{"listen": c.admin},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "ERROR"}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"ramjet": map[string]any{
			"listen":              []string{c.addr},
			"routes":              routes,
			"automatic_https":     map[string]any{"disable": true},
			"protocols":           []string{"h1", "h2c"},
			"idle_timeout":        "30s",
			"max_header_bytes":    1 << 20,
			"read_header_timeout": "10s",
		}}}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// reload posts a new config to the admin API (POST /load).
func (c *testCaddy) reload(o proxyOpts) {
	c.t.Helper()
	postLoad(c.t, c.admin, c.config(o))
	c.waitReady()
}

func (c *testCaddy) waitReady() {
	c.t.Helper()
	waitListening(c.t, c.addr)
}

// postLoad posts cfg to the Caddy admin API at admin (POST /load).
func postLoad(t testing.TB, admin string, cfg []byte) {
	t.Helper()
	resp, err := http.Post("http://"+admin+"/load", "application/json", bytes.NewReader(cfg))
	if err != nil {
		t.Fatalf("POST /load: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /load: %s: %s", resp.Status, b)
	}
}

// waitListening waits up to 5 seconds for each address to accept TCP
// connections.
func waitListening(t testing.TB, addrs ...string) {
	t.Helper()
	for _, addr := range addrs {
		ok := false
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
			if err == nil {
				conn.Close()
				ok = true
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !ok {
			t.Fatalf("caddy not listening on %s", addr)
		}
	}
}

func (c *testCaddy) url(path string) string { return "http://" + c.addr + path }

// post sends body to path and returns the response with its body read.
func (c *testCaddy) post(path, body string) (*http.Response, []byte) {
	c.t.Helper()
	resp, err := http.Post(c.url(path), "application/json", strings.NewReader(body))
	if err != nil {
		c.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading response: %v", err)
	}
	return resp, b
}

// chatBody renders a chat request body.
func chatBody(model string, stream bool, msgs ...[2]string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	m := make([]msg, len(msgs))
	for i, x := range msgs {
		m[i] = msg{x[0], x[1]}
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": m, "stream": stream, "max_tokens": 16})
	return string(b)
}

// longText is deterministic filler of about n bytes.
func longText(seed string, n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "%s sentence %d of the shared context. ", seed, i)
	}
	return sb.String()
}

// startCaddyfile adapts a Caddyfile (with {ADDR} and {ADMIN} standing for
// the client and admin addresses) and loads it.
func startCaddyfile(t testing.TB, src string) *testCaddy {
	t.Helper()
	c := &testCaddy{t: t, addr: freeAddr(t), admin: freeAddr(t)}
	src = strings.NewReplacer("{ADDR}", c.addr, "{ADMIN}", c.admin).Replace(src)
	cfg, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v", err)
	}
	for _, w := range warns {
		t.Logf("Caddyfile warning: %s", w.String())
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading caddy config: %v", err)
	}
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		if err := caddy.Load([]byte(`{"admin":{"disabled":true}}`), true); err != nil {
			t.Errorf("unloading caddy: %v", err)
		}
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
	})
	c.waitReady()
	return c
}
