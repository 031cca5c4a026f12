package module

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/deploy"
)

// setListenPorts sets the listen ports that deploy/Caddyfile takes apart
// from RJ_LISTEN and RJ_METRICS_LISTEN, as ramjet's main does before it
// adapts a Caddyfile. An invalid setting is left for the adapt to report.
func setListenPorts(t *testing.T) {
	t.Helper()
	ports, err := deploy.ListenPorts(os.LookupEnv)
	if err != nil {
		return
	}
	for k, v := range ports {
		t.Setenv(k, v)
	}
}

// serverAddrs are the addresses the running Caddy's HTTP servers listen
// on, as the kernel bound them (what `ss -ltn` shows).
func serverAddrs(t *testing.T) []*net.TCPAddr {
	t.Helper()
	app, err := caddy.ActiveContext().App("http")
	if err != nil {
		t.Fatal(err)
	}
	var out []*net.TCPAddr
	for _, srv := range app.(*caddyhttp.App).Servers {
		for _, ln := range srv.Listeners() {
			if a, ok := ln.Addr().(*net.TCPAddr); ok {
				out = append(out, a)
			}
		}
	}
	return out
}

// rawGet sends one request written by hand (to control the Host header
// and the protocol version) and returns the status and body.
func rawGet(t *testing.T, addr, request string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", request, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestDeployBindsListenHost: RJ_LISTEN=127.0.0.1:P binds 127.0.0.1 (the
// socket's address, not every interface) and serves any Host header, and
// an HTTP/1.0 request without one; the ops port likewise. Issue 15, item
// 3: the host was a Host matcher on an all-interfaces listener, and any
// other Host got an empty 200.
func TestDeployBindsListenHost(t *testing.T) {
	eng := startRecordingEngine(t)
	mlisten := listenLocal(t)
	for k, v := range map[string]string{
		"RJ_UPSTREAM":       eng.dial(),
		"RJ_LISTEN":         "127.0.0.1:0", // Caddy binds it itself
		"RJ_METRICS_LISTEN": mlisten,
		"RJ_ADMIN_LISTEN":   "off",
		"RJ_GRACE_PERIOD":   "5s",
	} {
		t.Setenv(k, v)
	}
	setListenPorts(t)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(deployCaddyfile(t)), nil)
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	if cfg, err = handOver(cfg, mlisten); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		stopCaddy(t)
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() { stopCaddy(t) })

	_, mport, _ := net.SplitHostPort(mlisten)
	var client string
	for _, a := range serverAddrs(t) {
		if !a.IP.Equal(net.IPv4(127, 0, 0, 1)) {
			t.Errorf("a server listens on %s, want 127.0.0.1 only", a)
		}
		if a.Port != 0 && a.AddrPort().String() != mlisten {
			client = a.String()
		}
	}
	if client == "" {
		t.Fatalf("no client listener besides the ops port %s in %v", mport, serverAddrs(t))
	}

	for _, tt := range []struct{ name, addr, request, want string }{
		{"client, Host: x", client, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", `"status"`},
		{"client, HTTP/1.0 without Host", client, "GET /health HTTP/1.0\r\n\r\n", `"status"`},
		{"ops, Host: x", mlisten, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "ramjet_upstreams "},
		{"ops, HTTP/1.0 without Host", mlisten, "GET /metrics HTTP/1.0\r\n\r\n", "ramjet_upstreams "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, body := rawGet(t, tt.addr, tt.request)
			if !strings.Contains(body, tt.want) {
				t.Errorf("status %d, body %q; want ramjet's answer with %s", status, body, tt.want)
			}
			if strings.HasPrefix(tt.request, "GET /metrics") && status != http.StatusOK {
				t.Errorf("ops status %d, want 200", status)
			}
			if strings.HasPrefix(tt.request, "GET /health") {
				var h struct{ Status string }
				if err := json.Unmarshal([]byte(body), &h); err != nil || h.Status == "" {
					t.Errorf("/health answered %.200q (%v), want ramjet's health JSON", body, err)
				}
			}
		})
	}
}

// TestDeployListenMismatch: deploy/Caddyfile adapted without the derived
// port (a Caddy build that is not ramjet's main) fails and says why,
// instead of listening on the default port.
func TestDeployListenMismatch(t *testing.T) {
	t.Setenv("RJ_UPSTREAM", "127.0.0.1:1")
	t.Setenv("RJ_LISTEN", "127.0.0.1:18000")
	t.Setenv("RAMJET_LISTEN_PORT", "8000")
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(deploy.Caddyfile, map[string]any{"filename": "deploy/Caddyfile"})
	if err == nil || !strings.Contains(err.Error(), "RAMJET_LISTEN_PORT") {
		t.Fatalf("adapt error = %v, want one naming RAMJET_LISTEN_PORT", err)
	}
}
