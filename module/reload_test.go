package module

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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
	return loadAdmin(t, src, env, nil)
}

// loadAdmin is loadDeployAdmin; edit, when not nil, changes the adapted
// config (after the listeners were handed over) before it is loaded.
func loadAdmin(t *testing.T, src string, env map[string]string, edit func(cfg map[string]any)) *deployWithAdmin {
	t.Helper()
	listen, mlisten, admin := listenLocal(t), listenLocal(t), listenLocal(t)
	all := map[string]string{
		"RJ_LISTEN":         listen,
		"RJ_METRICS_LISTEN": mlisten,
		"RJ_ADMIN_LISTEN":   admin,
		"RJ_GRACE_PERIOD":   "5s",
	}
	for k, v := range env {
		all[k] = strings.ReplaceAll(v, "{LISTEN_PORT}", listen[strings.LastIndexByte(listen, ':')+1:])
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
	if edit != nil {
		var m map[string]any
		if err := json.Unmarshal(cfg, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		if cfg, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
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
	return runClients(t, n, st, func(i int) streamClient {
		tr := &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}
		return httpStreamer(i, tr, base, model)
	})
}

// streamClient is one client of runClients: stream sends its k-th request
// and checks the answer; close releases its connections.
type streamClient struct {
	stream func(ctx context.Context, k int) error
	close  func()
}

// httpStreamer is client i, streaming with streamOnce over tr.
func httpStreamer(i int, tr *http.Transport, base, model string) streamClient {
	c := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	return streamClient{
		stream: func(ctx context.Context, k int) error {
			return streamOnce(ctx, c, base, model, fmt.Sprintf("client %d request %d", i, k))
		},
		close: tr.CloseIdleConnections,
	}
}

// runClients starts n clients made by client(i), each streaming one
// request after the other until stop is called; stop waits for them and
// releases their connections. counts returns each client's finished
// requests.
func runClients(t *testing.T, n int, st *trafficStats, client func(i int) streamClient) (counts func() []int64, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	done := make([]atomic.Int64, n)
	clients := make([]streamClient, n)
	for i := range n {
		clients[i] = client(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				err := clients[i].stream(ctx, k)
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
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			for _, c := range clients {
				c.close()
			}
		})
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
	reloadsUnderLoad(t, d, &st, 16, counts, stop)
}

// reloadsUnderLoad reloads d 6 times while the n clients of a runClients
// run stream (each reload once every client finished 3 more requests),
// stops them and fails the test if any request failed.
func reloadsUnderLoad(t *testing.T, d *deployWithAdmin, st *trafficStats, n int, counts func() []int64, stop func()) {
	t.Helper()
	everyClientAdvanced(t, counts, make([]int64, n), 3)
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
