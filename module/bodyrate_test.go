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

// TestBodyMinRateCut: with body_min_rate 4KiB (per second) and the default
// 60s body_timeout, a client trickling its body (one byte every 100ms of
// 4096 promised) gets 408 in the OpenAI shape once the first second's
// grace and the bytes it sent no longer cover the time taken, long before
// body_timeout; the engine sees nothing. An upload at full speed of a
// body larger than one second's minimum is answered.
func TestBodyMinRateCut(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{})
	c := startCaddyfile(t, `{
	admin {ADMIN}
	auto_https off
	log {
		level ERROR
	}
}

http://{ADDR} {
	ramjet_guard `+ss[0].Addr()+` {
		body_min_rate 4KiB
		model_check off
	}
	ramjet_observe
	reverse_proxy `+ss[0].Addr()+` {
		lb_policy ramjet
		flush_interval -1
	}
}
`)
	conn, err := net.Dial("tcp", c.client)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{", c.client)
	start := time.Now()
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
	if took < minRateGrace {
		t.Errorf("cut after %v, within the %v grace", took, minRateGrace)
	}
	if n := ss.requests()[0]; n != 0 {
		t.Errorf("the engine received %d requests", n)
	}
	t.Logf("upload trickled below body_min_rate cut after %v", took)

	// At full speed a 64 KiB body (16 s of the minimum rate) goes through.
	resp2, body := c.chat(chatBody("qwen3-8b", false, [2]string{"user", longText("fast upload", 64<<10)}))
	if resp2.StatusCode != http.StatusOK {
		t.Fatalf("fast upload: status %d: %s", resp2.StatusCode, body)
	}
}
