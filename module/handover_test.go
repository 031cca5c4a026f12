package module

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// deployWithAdmin is deploy/Caddyfile (or src) loaded with an admin
// endpoint on a handed-over listener, for the tests that reload it.
type deployWithAdmin struct {
	*proxy
	admin string // 127.0.0.1:port
	cfg   []byte // the loaded JSON config
}

// loadDeployAdmin adapts src under env like loadCaddyfile, with the admin
// endpoint on a handed-over listener.
func loadDeployAdmin(t *testing.T, src string, env map[string]string) *deployWithAdmin {
	t.Helper()
	listen, mlisten, admin := listenLocal(t), listenLocal(t), listenLocal(t)
	all := map[string]string{
		"RJ_LISTEN":         listen,
		"RJ_METRICS_LISTEN": mlisten,
		"RJ_ADMIN_LISTEN":   admin,
		"RJ_GRACE_PERIOD":   "5s",
	}
	for k, v := range env {
		all[k] = v
	}
	for k, v := range all {
		t.Setenv(k, v)
	}
	setListenPorts(t)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	if cfg, err = handOver(cfg, listen, mlisten, admin); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		stopCaddy(t)
		t.Fatalf("loading: %v", err)
	}
	t.Cleanup(func() { stopCaddy(t) })
	return &deployWithAdmin{
		proxy: &proxy{base: "http://" + listen, metrics: "http://" + mlisten, addrs: []string{listen, mlisten}},
		admin: admin, cfg: cfg,
	}
}

// forceReload posts the config again through the admin API; Caddy
// reloads an unchanged config only when asked to revalidate.
func (d *deployWithAdmin) forceReload(t *testing.T) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+d.admin+"/load", bytes.NewReader(d.cfg))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Cache-Control", "must-revalidate")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /load: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /load: %s: %s", resp.Status, b)
	}
}

// trafficStats counts what the clients of a traffic run saw.
type trafficStats struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string // the first few failures
}

func (s *trafficStats) fail(format string, args ...any) {
	s.failed.Add(1)
	s.mu.Lock()
	if len(s.errs) < 10 {
		s.errs = append(s.errs, fmt.Sprintf(format, args...))
	}
	s.mu.Unlock()
}

// streamOnce sends one streaming chat request and checks that the stream
// ends with [DONE].
func streamOnce(ctx context.Context, c *http.Client, base, model, prompt string) error {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, model, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	var local string
	var reused bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		local, reused = ci.Conn.LocalAddr().String(), ci.Reused
	}}))
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("connection %s (reused %v): %w", local, reused, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	done, chunks := false, 0
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: {"):
			chunks++
		case strings.HasPrefix(line, "event: error"):
			return fmt.Errorf("stream error event after %d chunks", chunks)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the stream after %d chunks: %w", chunks, err)
	}
	if !done {
		return fmt.Errorf("stream ended without [DONE] after %d chunks", chunks)
	}
	return nil
}

// runStreamers starts n clients, each with its own keep-alive connection
// pool (as n SDK clients would have, no retries), streaming until stop is
// called; stop waits for them and returns each client's request count.
func runStreamers(t *testing.T, n int, base, model string, st *trafficStats) (counts func() []int64, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	done := make([]atomic.Int64, n)
	transports := make([]*http.Transport, n)
	for i := range n {
		tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}
		transports[i] = tr
		c := &http.Client{Transport: tr, Timeout: 60 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				err := streamOnce(ctx, c, base, model, fmt.Sprintf("client %d request %d", i, k))
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					st.fail("client %d request %d: %v", i, k, err)
				} else {
					st.ok.Add(1)
				}
				done[i].Add(1)
			}
		}()
	}
	counts = func() []int64 {
		out := make([]int64, n)
		for i := range done {
			out[i] = done[i].Load()
		}
		return out
	}
	stop = func() {
		cancel()
		wg.Wait()
		for _, tr := range transports {
			tr.CloseIdleConnections()
		}
	}
	return counts, stop
}

// everyClientAdvanced waits until each client finished at least k more
// requests than in before.
func everyClientAdvanced(t *testing.T, counts func() []int64, before []int64, k int64) {
	t.Helper()
	eventually(t, fmt.Sprintf("every client to finish %d more requests", k), func() bool {
		for i, c := range counts() {
			if c < before[i]+k {
				return false
			}
		}
		return true
	})
}

// TestReloadUnderStreamingLoad: 16 streaming clients without retries
// through deploy/Caddyfile while the admin API reloads the config 6 times:
// no request fails. Issue 15, item 5.
func TestReloadUnderStreamingLoad(t *testing.T) {
	ss := startSims(t, 4, enginesim.Options{})
	d := loadDeployAdmin(t, deployCaddyfile(t), map[string]string{"RJ_UPSTREAM": strings.Join(ss.dials(), ",")})
	var st trafficStats
	counts, stop := runStreamers(t, 16, d.base, ss[0].Model(), &st)
	defer stop()
	everyClientAdvanced(t, counts, make([]int64, 16), 3)
	const reloads = 6
	for range reloads {
		before := counts()
		d.forceReload(t)
		everyClientAdvanced(t, counts, before, 3)
	}
	stop()
	t.Logf("%d reloads: %d requests ok, %d failed", reloads, st.ok.Load(), st.failed.Load())
	if n := st.failed.Load(); n > 0 {
		t.Errorf("%d of %d requests failed across %d reloads; first: %s", n, n+st.ok.Load(), reloads, strings.Join(st.errs, "; "))
	}
}

// keepOpenListener is a listener whose Close leaves the socket open, as
// Caddy's listener pool does for the servers of an old config.
type keepOpenListener struct{ net.Listener }

func (keepOpenListener) Close() error { return nil }

// TestHandoverCloseBeforeListenerClose: net/http's Shutdown marks the
// server as shutting down before it closes its listener, and a connection
// that finishes a response in between is closed at once, without
// "Connection: close". With a newer server on the socket (a reload), the
// connection waits for the old listener to close and moves to the new
// server, so the client's next request is answered there.
func TestHandoverCloseBeforeListenerClose(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	var h Handover
	old := h.WrapListener(keepOpenListener{inner})
	defer old.Close()
	client, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sc, err := old.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c := sc.(*handoverConn)
	// The old server answers a request and reaches the boundary.
	if _, err := c.Write([]byte("answer 1\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.SetWriteDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(client)
	if line, err := br.ReadString('\n'); err != nil || line != "answer 1\n" {
		t.Fatalf("first answer: %q, %v", line, err)
	}
	// The reload: the new server is on the socket, the old one begins its
	// shutdown and closes the idle connection before its listener.
	next := h.WrapListener(keepOpenListener{inner})
	defer next.Close()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	var closeErr error
	closeReturned := false
	eventually(t, "the old server's close to wait for its listener or return", func() bool {
		select {
		case closeErr = <-closed:
			closeReturned = true
			return true
		default:
		}
		if c.mu.TryLock() {
			c.mu.Unlock()
			return false
		}
		return true // Close holds the connection while it waits
	})
	if closeReturned {
		t.Fatalf("the old server's close (%v) did not wait for its listener: the connection is gone under its client", closeErr)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write([]byte("request 2\n")); err != nil {
		t.Fatal(err)
	}
	nc, err := next.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := <-closed; err != nil {
		t.Fatalf("old server's close: %v", err)
	}
	got, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil || got != "request 2\n" {
		t.Fatalf("new server read %q, %v; want the client's next request", got, err)
	}
	if _, err := nc.Write([]byte("answer 2\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "answer 2\n" {
		t.Fatalf("second answer: %q, %v", line, err)
	}
}

// TestHandoverCloseWithoutReload: with no newer server on the socket, a
// close is a close: the client sees EOF at once.
func TestHandoverCloseWithoutReload(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	var h Handover
	ln := h.WrapListener(keepOpenListener{inner})
	defer ln.Close()
	client, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Write([]byte("answer\n")); err != nil {
		t.Fatal(err)
	}
	if err := sc.SetWriteDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(client)
	if err != nil || string(b) != "answer\n" {
		t.Fatalf("client read %q, %v; want the answer then EOF", b, err)
	}
}
