package module

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestEngineLoadSteersRouting runs the real Caddy with engine_metrics in
// front of two simulated engines. Requests sent straight to one engine
// (another router's traffic, invisible to this instance's reservations)
// reach the router's load through the scrapes: while they run, new
// requests go to the other replica; once they end, the external load
// drops back to zero. The engine's KV capacity is handed to the index.
func TestEngineLoadSteersRouting(t *testing.T) {
	cfg := engine.Config{CapacityTokens: 32768, BlockSize: 16}
	ss := startSims(t, 2, enginesim.Options{TimeScale: 1, Engine: cfg})
	busy, idle := ss[0], ss[1]
	c := startObsCaddy(t, ss.dials(),
		obsOpts{Policy: map[string]any{"engine_metrics": map[string]any{"interval": "50ms", "timeout": "5s"}}})

	if resp, b := c.chat(chatBody("qwen3-8b", false, [2]string{"user", "hello"})); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	f := lookupFleet("")
	slot, ok := f.Base().Lookup(busy.Addr())
	if !ok {
		t.Fatal("busy engine not registered")
	}
	idBusy, idIdle := f.RouteID(busy.Addr()), f.RouteID(idle.Addr())
	eventually(t, "the engine's KV capacity in the index", func() bool { return f.Base().Capacity(slot) == 32768 })

	// Four long requests sent to the busy engine directly.
	const direct = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{}, direct)
	for i := range direct {
		go func() {
			defer func() { done <- struct{}{} }()
			body := `{"model":"qwen3-8b","messages":[{"role":"user","content":"` + longText(fmt.Sprint("other", i), 1000) + `"}],"max_tokens":30000,"stream":true}`
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+busy.Addr()+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if res, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}()
	}
	eventually(t, "the direct requests in the router's load", func() bool {
		r, w, _ := f.Base().ExternalLoad(slot)
		return r+w == direct
	})

	got := map[string]int{}
	for i := range 8 {
		resp, b := c.chat(chatBody("qwen3-8b", false, [2]string{"user", fmt.Sprintf("question %d: %s", i, longText(fmt.Sprint("q", i), 300))}))
		if resp.StatusCode != 200 {
			t.Fatalf("chat %d: %s: %s", i, resp.Status, b)
		}
		got[resp.Header.Get(HeaderUpstream)]++
	}
	if got[idBusy] != 0 || got[idIdle] != 8 {
		t.Fatalf("with %d external requests on one replica, ramjet sent busy:%d idle:%d, want 0:8", direct, got[idBusy], got[idIdle])
	}
	if r, w, _ := f.Base().ExternalLoad(slot); r+w != direct {
		t.Fatalf("external load %d after the burst, want %d", r+w, direct)
	}

	cancel()
	for range direct {
		<-done
	}
	eventually(t, "the external load gone once the direct requests end", func() bool {
		r, w, _ := f.Base().ExternalLoad(slot)
		return r+w == 0
	})
}
