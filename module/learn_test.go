package module

import (
	"net/http"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestAnswerCorrectsIndex: the engine's own cached-token count in an
// answer reaches the index (Router.Observe through the metrics observer).
// The engine evicts a prompt the index believes it holds (its prefix cache
// is reset behind ramjet's back); the next answer reports no cached tokens
// where the index predicted the whole prompt, and the replica gets a
// horizon: beliefs older than the eviction no longer count.
func TestAnswerCorrectsIndex(t *testing.T) {
	ss := startSims(t, 1, enginesim.Options{TimeScale: 1, Engine: engine.Config{CapacityTokens: 1 << 20, BlockSize: 16}})
	c := startObsCaddy(t, ss.dials(), obsOpts{})
	body := chatBody("qwen3-8b", false, [2]string{"system", longText("learn", 4000)}, [2]string{"user", "hello"})
	if resp, b := c.chat(body); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	f := lookupFleet("")
	slot, ok := f.Base().Lookup(ss[0].Addr())
	if !ok {
		t.Fatal("engine not registered")
	}
	if h := f.Base().Index().Horizon(slot); h != 0 {
		t.Fatalf("horizon %d before any eviction", h)
	}
	// The same prompt again, served from the engine's cache: the answer
	// confirms the index.
	if resp, b := c.chat(body); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	if h := f.Base().Index().Horizon(slot); h != 0 {
		t.Fatalf("horizon %d after a confirming answer", h)
	}
	resp, err := http.Post("http://"+ss[0].Addr()+"/reset_prefix_cache", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp, b := c.chat(body); resp.StatusCode != 200 {
		t.Fatalf("chat: %s: %s", resp.Status, b)
	}
	eventually(t, "the eviction learned from the answer", func() bool { return f.Base().Index().Horizon(slot) > 0 })
}
