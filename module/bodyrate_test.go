package module

import (
	"net/http"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/edge"
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
	took := trickledUpload(t, c.client) // slowclient_test.go: a 408 request_timeout
	if took < edge.MinRateGrace {
		t.Errorf("cut after %v, within the %v grace", took, edge.MinRateGrace)
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
