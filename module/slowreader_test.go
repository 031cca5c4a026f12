package module

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// streamingEngine answers every chat request with an SSE stream: with
// endless set, 32 KiB events as fast as the connection takes them until
// the request is canceled; otherwise events every tick for total, then
// [DONE]. ended counts the streams whose request context ended before
// the engine finished (the proxy gave up on them).
type streamingEngine struct {
	endless     bool
	tick, total time.Duration
	ended       atomic.Int64
	started     atomic.Int64
}

func (e *streamingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":[{"id":"m"}]}`)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	e.started.Add(1)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	event := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 32<<10) + "\"}}]}\n\n")
	if !e.endless {
		event = []byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
	}
	var t <-chan time.Time
	if !e.endless {
		tk := time.NewTicker(e.tick)
		defer tk.Stop()
		t = tk.C
	}
	deadline := time.Now().Add(e.total)
	for {
		if r.Context().Err() != nil {
			e.ended.Add(1)
			return
		}
		if !e.endless && time.Now().After(deadline) {
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			_ = rc.Flush()
			return
		}
		if _, err := w.Write(event); err != nil {
			e.ended.Add(1)
			return
		}
		if err := rc.Flush(); err != nil {
			e.ended.Add(1)
			return
		}
		if t != nil {
			select {
			case <-t:
			case <-r.Context().Done():
			}
		}
	}
}

// observeWriteTimeout sets ramjet_observe's write_timeout in c's config.
func observeWriteTimeout(t *testing.T, cfg []byte, d string) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	routes := m["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["ramjet"].(map[string]any)["routes"].([]any)
	set := 0
	for _, rt := range routes {
		for _, h := range rt.(map[string]any)["handle"].([]any) {
			if h := h.(map[string]any); h["handler"] == "ramjet_observe" {
				h["write_timeout"] = d
				set++
			}
		}
	}
	if set == 0 {
		t.Fatal("no ramjet_observe handler in the config")
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSlowReaderCut: a real client that sends a streaming request, reads
// the response head and then stops reading (its receive buffer small)
// while the engine streams without end. With write_timeout 1s the proxy
// gives up once its writes make no progress: the engine's request is
// canceled (the proxy goroutine is free again) and
// ramjet_slow_reader_cuts_total counts it. A stream that lasts longer
// than write_timeout but whose client reads it is not cut.
func TestSlowReaderCut(t *testing.T) {
	slowReaderCut(t, func(cfg []byte) []byte { return observeWriteTimeout(t, cfg, "1s") })
}

// TestSlowReaderCutByServer: with the server's own write_idle_timeout (1s)
// no longer than write_timeout (here its 60s default), ramjet_observe
// sets no write deadline of its own; Caddy's, pushed before every write,
// cuts the same client after 1s without progress, and the cut counts in
// ramjet_slow_reader_cuts_total as before.
func TestSlowReaderCutByServer(t *testing.T) {
	slowReaderCut(t, func(cfg []byte) []byte {
		var m map[string]any
		if err := json.Unmarshal(cfg, &m); err != nil {
			t.Fatal(err)
		}
		m["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["ramjet"].(map[string]any)["write_idle_timeout"] = "1s"
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
}

// slowReaderCut is TestSlowReaderCut with the config c.config made into
// one whose writes are bounded by 1s without progress by setup.
func slowReaderCut(t *testing.T, setup func(cfg []byte) []byte) {
	// One engine for both streams (no reload between them): a prompt
	// saying "hello again" gets the slow finite stream, any other the
	// endless one.
	endless := &streamingEngine{endless: true, total: time.Hour}
	slow := &streamingEngine{tick: 200 * time.Millisecond, total: 2500 * time.Millisecond}
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		if bytes.Contains(b, []byte("hello again")) {
			slow.ServeHTTP(w, r)
			return
		}
		endless.ServeHTTP(w, r)
	}))
	defer eng.Close()
	c := &testCaddy{t: t, client: listenLocal(t), admin: listenLocal(t), ups: []string{strings.TrimPrefix(eng.URL, "http://")}}
	c.load(setup(c.config(proxyOpts{})))
	before := testutil.ToFloat64(slowReaderCuts)

	conn, err := net.Dial("tcp", c.client)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	body := chatBody("m", true, [2]string{"user", "hello"})
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", c.client, len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 4<<10), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	start := time.Now()
	// The client reads nothing more from here on.
	// The cut counts on the writing goroutine after the failed write has
	// cancelled the request, which ends the engine's stream: a loaded
	// machine can run the engine's end first, so wait for both.
	eventually(t, "the engine's stream to end and the cut to count once the client stopped reading", func() bool {
		return endless.ended.Load() == 1 && testutil.ToFloat64(slowReaderCuts) > before
	})
	took := time.Since(start)
	if got := testutil.ToFloat64(slowReaderCuts) - before; got != 1 {
		t.Errorf("ramjet_slow_reader_cuts_total rose by %v, want 1", got)
	}
	if took < 800*time.Millisecond {
		t.Errorf("cut after %v, before 7/8 of the 1s write_timeout", took)
	}
	t.Logf("a stream its client stopped reading was cut after %v", took)

	// A reading client's stream outlasts write_timeout: not cut.
	t0 := time.Now()
	r2, data := c.chat(chatBody("m", true, [2]string{"user", "hello again"}))
	if r2.StatusCode != http.StatusOK || !strings.HasSuffix(string(data), "data: [DONE]\n\n") {
		t.Fatalf("status %d, stream ends with %q", r2.StatusCode, data[max(0, len(data)-40):])
	}
	if el := time.Since(t0); el < 2*time.Second {
		t.Fatalf("the stream took %v, want at least 2s (longer than write_timeout)", el)
	}
	if slow.ended.Load() != 0 {
		t.Error("a stream its client read was cut")
	}
	if got := testutil.ToFloat64(slowReaderCuts) - before; got != 1 {
		t.Errorf("ramjet_slow_reader_cuts_total rose by %v, want 1", got)
	}
}
