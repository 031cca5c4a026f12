package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "healthcheck",
		Usage: "[--url <url>] [--server-name <name>] [--timeout <duration>] [--strict]",
		Short: "Probes ramjet's /health (for container health checks)",
		Long: `
Asks ramjet's GET /health and exits 0 when it answers "ok" or "degraded"
(some replicas out, traffic still served), 1 otherwise (unhealthy, no
answer, timeout). With --strict only "ok" passes. It needs no shell, so a
FROM scratch image can use it as its HEALTHCHECK.

The default URL is http://127.0.0.1:<port>/health, the port taken from
RJ_LISTEN (default 8000), so it follows the production Caddyfile. For an
https URL the certificate is verified against the system roots and Caddy's
local CA root ($XDG_DATA_HOME/caddy/pki/authorities/local/root.crt, the
root of 'tls internal'); --server-name (default: RJ_SITE_NAME) is the TLS
name and Host to ask for when the URL names a loopback address.`,
		Func: func(fl caddycmd.Flags) (int, error) {
			p := probe{url: fl.String("url"), serverName: fl.String("server-name"), timeout: fl.Duration("timeout")}
			return healthcheck(os.Stdout, p, fl.Bool("strict"))
		},
		Flags: func() *flag.FlagSet {
			fs := flag.NewFlagSet("healthcheck", flag.ExitOnError)
			fs.String("url", defaultHealthURL(os.Getenv("RJ_LISTEN")), "URL of ramjet's /health")
			fs.String("server-name", os.Getenv("RJ_SITE_NAME"), "TLS server name and Host header (https URLs)")
			fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
			fs.Bool("strict", false, `pass only on "ok" (not "degraded")`)
			return fs
		}(),
	})
}

// defaultHealthURL derives the probe URL from RJ_LISTEN (":8000",
// "0.0.0.0:8000", "127.0.0.1:8080", "[::]:8000"): always loopback.
func defaultHealthURL(listen string) string {
	port := "8000"
	if listen != "" {
		l := strings.TrimPrefix(strings.TrimPrefix(listen, "http://"), "tcp/")
		if _, p, err := net.SplitHostPort(l); err == nil && p != "" {
			port = p
		}
	}
	return "http://127.0.0.1:" + port + "/health"
}

// probe is one /health request.
type probe struct {
	url        string
	serverName string
	timeout    time.Duration
}

// healthcheck runs one probe and returns the exit code.
func healthcheck(w io.Writer, p probe, strict bool) (int, error) {
	status, err := p.status()
	if err != nil {
		return 1, err
	}
	fmt.Fprintln(w, status)
	if status == "ok" || (!strict && status == "degraded") {
		return 0, nil
	}
	return 1, fmt.Errorf("health %q", status)
}

// localCARoot is where Caddy keeps the root certificate of its local CA.
func localCARoot() string {
	dir := os.Getenv("XDG_DATA_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".local", "share")
	}
	return filepath.Join(dir, "caddy", "pki", "authorities", "local", "root.crt")
}

// client returns the HTTP client of the probe: system roots plus Caddy's
// local root for https.
func (p probe) client() *http.Client {
	tr := &http.Transport{Proxy: nil, ForceAttemptHTTP2: true}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if path := localCARoot(); path != "" {
		if pem, err := os.ReadFile(path); err == nil {
			roots.AppendCertsFromPEM(pem)
		}
	}
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, ServerName: p.serverName, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr, Timeout: p.timeout}
}

// status returns the "status" of a /health answer.
func (p probe) status() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return "", fmt.Errorf("health request: %w", err)
	}
	if p.serverName != "" {
		req.Host = p.serverName
	}
	c := p.client()
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("health probe: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return "", fmt.Errorf("health answer (HTTP %d): %w", resp.StatusCode, err)
	}
	if body.Status == "" {
		return "", errors.New("health answer has no status")
	}
	return body.Status, nil
}
