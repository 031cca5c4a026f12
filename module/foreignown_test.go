package module

import (
	"context"
	"fmt"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestE2EForeignOwnRuns: through a real Caddy and an engine simulator
// publishing KV events, with this instance alone, none of its own
// requests' stored runs reads as another instance's prefill: 20 distinct
// prompts of lengths that the bytes-per-token estimate gets wrong by a few
// tokens either way, some of them conversations of up to 18 messages (the
// chat template's tokens per message), streaming and not, with an instant
// engine and with one computing in real time (4x: chunked prefill, events
// during it); and an agent's conversation growing over 20 turns (routed
// on its cached message prefix). Before the credit took the preflight's
// token count, 11-12 of the 20 prompts and 756 tokens of the agent's
// turns read as foreign (bench/EXPERIMENTS.md, section 32).
func TestE2EForeignOwnRuns(t *testing.T) {
	for _, tt := range []struct {
		name  string
		timed bool
		agent bool
	}{{"instant", false, false}, {"timed", true, false}, {"agent", false, true}} {
		t.Run(tt.name, func(t *testing.T) {
			sim, cl, model, k := startForeignCaddy(t, func(o *enginesim.Options) {
				if tt.timed {
					o.Instant, o.TimeScale = false, 4
				}
			})
			warmKV(t, cl, model, k, sim.Addr())
			// Every block the engine holds is in the index: every run of
			// the requests so far has reached the estimate.
			settled := func() bool {
				blocks := 0
				for _, r := range sim.Stats() {
					blocks += r.Engine.CachedBlocks
				}
				return k.p.Index().Entries() == int64(blocks)
			}
			eventually(t, "the warm-up's runs in the index", settled)
			agent := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(longText("agent system", 4000)), userMsg(longText("task", 800))}
			const n = 20
			bad, total := 0, uint64(0)
			for i := range n {
				before, _ := k.fp.Counted()
				msgs := []openai.ChatCompletionMessageParamUnion{userMsg(longText(fmt.Sprintf("own %d", i), 1500+37*i))}
				if i%3 == 2 { // a conversation: each message adds template tokens the bytes do not show
					msgs = append([]openai.ChatCompletionMessageParamUnion{openai.SystemMessage(longText(fmt.Sprintf("system %d", i), 300))}, msgs...)
					for j := range 2 * (i%4 + 1) {
						msgs = append(msgs, openai.AssistantMessage(fmt.Sprintf("reply %d", j)), userMsg(fmt.Sprintf("follow-up %d of %d", j, i)))
					}
				}
				if tt.agent {
					msgs = agent
					agent = append(agent, openai.AssistantMessage(longText(fmt.Sprintf("tool call %d", i), 120)),
						openai.ToolMessage(longText(fmt.Sprintf("tool result %d", i), 300), fmt.Sprintf("call%d", i)))
				}
				if i%2 == 0 {
					kvChat(t, cl, model, msgs)
				} else {
					st := cl.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
						Model: model, Messages: msgs, MaxTokens: openai.Int(4)})
					for st.Next() {
					}
					if err := st.Err(); err != nil {
						t.Fatalf("stream: %v", err)
					}
				}
				eventually(t, "the request's runs in the index", settled)
				if after, _ := k.fp.Counted(); after != before {
					bad++
					total += after - before
					t.Logf("own request %d (streaming %v): %d tokens read as foreign", i, i%2 == 1, after-before)
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d own requests had runs read as foreign (%d tokens)", bad, n, total)
			}
		})
	}
}
