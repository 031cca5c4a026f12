package module

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestSlowUploadCut: through deploy/Caddyfile with RJ_BODY_TIMEOUT=1s, a
// client trickling its body (one byte every 100ms of 4096 promised) gets
// 408 in the OpenAI shape once the timeout passes, and the engine sees
// nothing; a request whose answer takes longer than the body timeout is
// not cut by it. Issue 15, item 6.
func TestSlowUploadCut(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{})
	p := mustLoad(t, deployCaddyfile(t), map[string]string{
		"RJ_UPSTREAM":     ss[0].Addr(),
		"RJ_BODY_TIMEOUT": "1s",
	})
	took := trickledUpload(t, strings.TrimPrefix(p.base, "http://"))
	if took < time.Second {
		t.Errorf("cut after %v, before the 1s body timeout", took)
	}
	if n := ss.requests()[0]; n != 0 {
		t.Errorf("the engine received %d requests", n)
	}
	t.Logf("trickled upload cut after %v", took)

	// A request whose answer takes 1.5s (longer than the body timeout):
	// the deadline was lifted once the body was read.
	if err := ss[0].SetFaults(enginesim.Faults{Latency: 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	if err := chatOnce(c, p.base, ss[0].Model(), "slow answer"); err != nil {
		t.Errorf("a request answered after the body timeout: %v", err)
	}
}

// TestSlowUploadCutDeferred: TestSlowUploadCut with the server's read
// idle timeout (500ms) under the body timeout (1s), where the guard sets
// its deadline only before the body's second read (Caddy's idle timeout
// bounds the first): the trickled upload still gets 408 at 1s, not
// before, and a body sent at once is answered.
func TestSlowUploadCutDeferred(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{})
	src := strings.Replace(deployCaddyfile(t), "read_header 30s", "read_header 30s\n\t\t\tread_body_idle 500ms", 1)
	if !strings.Contains(src, "read_body_idle") {
		t.Fatal("no server timeouts in deploy/Caddyfile to add read_body_idle to")
	}
	p := mustLoad(t, src, map[string]string{"RJ_UPSTREAM": ss[0].Addr(), "RJ_BODY_TIMEOUT": "1s"})
	if took := trickledUpload(t, strings.TrimPrefix(p.base, "http://")); took < time.Second {
		t.Errorf("cut after %v, before the 1s body timeout", took)
	}
	if n := ss.requests()[0]; n != 0 {
		t.Errorf("the engine received %d requests", n)
	}
	c := &http.Client{Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	if err := chatOnce(c, p.base, ss[0].Model(), "at once"); err != nil {
		t.Errorf("a body sent at once: %v", err)
	}
}

// trickledUpload sends a chat request promising a 4096-byte body and then
// trickles it (one byte every 100ms) until the proxy answers, and checks
// the answer is the OpenAI-shaped 408 request_timeout. It returns how long
// the answer took. The test fails when none comes within 20s.
func trickledUpload(t *testing.T, addr string) time.Duration {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The clock starts before the head is written: the guard's deadline
	// starts when the proxy has read it, which under load can be before
	// this goroutine runs again after the write (a cut 2.4 ms "early" was
	// seen in CI at load ~20).
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{", addr)
	answered := make(chan *http.Response, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			close(answered)
			return
		}
		answered <- resp
	}()
	// The client's own pace (not a synchronisation): one byte per tick
	// until the proxy answers or 20s pass.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var resp *http.Response
trickle:
	for {
		select {
		case r, ok := <-answered:
			if !ok {
				t.Fatal("the connection closed without an answer")
			}
			resp = r
			break trickle
		case <-tick.C:
			if time.Since(start) > 20*time.Second {
				t.Fatal("the trickled upload was not cut within 20s")
			}
			_, _ = conn.Write([]byte(" "))
		}
	}
	took := time.Since(start)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", resp.StatusCode)
	}
	var sb strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
	we := decodeWireError(t, []byte(sb.String()))
	if we.Error.Code == nil || *we.Error.Code != "request_timeout" {
		t.Errorf("error body %s, want code request_timeout", sb.String())
	}
	return took
}

// TestMethodNotAllowed: /health and /v1/models answer other methods than
// GET and HEAD with an OpenAI-shaped 405 themselves; the engine sees
// nothing. Issue 15 (POST /health and /v1/models reached an engine).
func TestMethodNotAllowed(t *testing.T) {
	eng := startRecordingEngine(t)
	p := mustLoad(t, deployCaddyfile(t), map[string]string{"RJ_UPSTREAM": eng.dial()})
	for _, tt := range []struct{ method, path string }{
		{"POST", "/health"}, {"PUT", "/health"}, {"POST", "/v1/models"}, {"DELETE", "/v1/models/m1"},
		{"POST", "//v1/models/"},
	} {
		t.Run(tt.method+tt.path, func(t *testing.T) {
			eng.take()
			req, err := http.NewRequest(tt.method, p.base+tt.path, strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var sb strings.Builder
			_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
				t.Fatalf("status %d Allow %q, want 405 with Allow: GET, HEAD; body %s", resp.StatusCode, resp.Header.Get("Allow"), sb.String())
			}
			if we := decodeWireError(t, []byte(sb.String())); we.Error.Code == nil || *we.Error.Code != "method_not_allowed" {
				t.Errorf("body %s, want code method_not_allowed", sb.String())
			}
			if got := eng.take(); len(got) != 0 {
				t.Errorf("the engine received %s %s", got[0].method, got[0].path)
			}
		})
	}
	// GET still answers.
	if resp, err := http.Get(p.base + "/v1/models"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/models: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}
