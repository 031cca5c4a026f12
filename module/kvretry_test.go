package module

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestE2EKVRetryReleasesEarlierHold: a precise decision holds the chosen
// replica's blocks until the engine confirms them or the request ends. When
// that replica fails and a retry picks another, the earlier replica's holds
// end with the request too (the grace after it), not at the kv_predict_ttl
// bound (here 10 minutes).
func TestE2EKVRetryReleasesEarlierHold(t *testing.T) {
	ss := startSims(t, 2, enginesim.Options{KVEvents: enginesim.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0"}})
	a, b := ss[0].Addr(), ss[1].Addr()
	c := startCaddy(t, []string{a, b}, proxyOpts{Retries: 2, NoKeepAlive: true, Policy: map[string]any{"kv": map[string]any{
		"engines": []any{
			map[string]any{"upstream": a, "events": ss[0].KVEndpoints()[0]},
			map[string]any{"upstream": b, "events": ss[1].KVEndpoints()[0]},
		},
		"block_size":       16,
		"predict_ttl":      "10m",
		"tokenize_timeout": "5s",
		"tokenize_wait":    "always", // the precise decision under test
		// The preflight asks B, which keeps answering while A refuses.
		"tokenize_url": "http://" + b,
	}}})
	cl := newClient(c)
	f := lookupFleet("")
	k := liveKV(t)
	send := func(msgs []openai.ChatCompletionMessageParamUnion) string {
		t.Helper()
		var resp *http.Response
		if _, err := cl.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: "qwen3-8b", Messages: msgs, MaxTokens: openai.Int(2),
		}, option.WithResponseInto(&resp)); err != nil {
			t.Fatal(err)
		}
		return resp.Header.Get(HeaderUpstream)
	}
	ra, _ := k.p.Index().Lookup(a)
	rb, _ := k.p.Index().Lookup(b)
	// Until both feeds delivered an event the replicas are routed by the
	// estimate; distinct warm-up prompts make both engines publish.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; !k.p.Index().Fresh(ra) || !k.p.Index().Fresh(rb); i++ {
		if time.Now().After(deadline) {
			t.Fatalf("feeds never became fresh: %+v", k.p.Index().AppendReplicaStats(nil))
		}
		send([]openai.ChatCompletionMessageParamUnion{userMsg(longText("warm-up "+itoa(i), 400))})
	}
	// A conversation whose first turn a precise decision sent to A.
	var sys string
	for i := range 20 {
		s := longText("retry hold "+itoa(i), 2048)
		before := k.preciseN()
		if id := send([]openai.ChatCompletionMessageParamUnion{systemMsg(s), userMsg("one")}); id == f.RouteID(a) && k.preciseN() == before+1 {
			sys = s
			break
		}
	}
	if sys == "" {
		t.Fatal("no precise decision landed on engine A")
	}
	eventually(t, "first turn's predictions confirmed or released", func() bool { return k.p.Index().Predicted() == 0 })

	// A refuses: the precise decision holds the new turn's blocks on A, the
	// dial fails, the retry goes to B. When the request ends, nothing may
	// stay held on A.
	if err := ss[0].SetFaults(enginesim.Faults{RefuseConnections: true}); err != nil {
		t.Fatal(err)
	}
	before := k.preciseN()
	if id := send([]openai.ChatCompletionMessageParamUnion{systemMsg(sys), userMsg("one"), openai.AssistantMessage("ok"),
		userMsg(longText("second turn", 1024))}); id != f.RouteID(b) {
		t.Fatalf("retry served by %s, want engine B %s", id, f.RouteID(b))
	}
	if got := k.preciseN() - before; got != 2 {
		t.Fatalf("%d precise decisions for the retried request, want 2 (A, then B)", got)
	}
	eventually(t, "predictions of the failed attempt on A released", func() bool { return k.p.Index().Predicted() == 0 })
}
