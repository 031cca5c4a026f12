package engine_test

import (
	"fmt"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// A discrete-event loop over one engine: submit at arrival times, advance
// to the next step end, read per-request events. Request 1 arrives while
// request 0 is in prefill, waits for that step to end, then finds the
// shared prefix cached.
func Example() {
	e := engine.New(engine.Config{})
	system := engine.SyntheticTokens(nil, 42, 1000) // a shared system prompt
	arrivals := []time.Duration{0, 5 * time.Millisecond}
	var evs []engine.Event
	for i, at := range arrivals {
		evs = e.AdvanceTo(at, evs)
		prompt := engine.SyntheticTokens(append([]uint32(nil), system...), uint64(i), 50)
		if err := e.Submit(engine.Request{ID: uint64(i), Prompt: prompt, MaxTokens: 8}); err != nil {
			panic(err)
		}
	}
	for {
		t, ok := e.NextEventTime()
		if !ok {
			break
		}
		evs = e.AdvanceTo(t, evs)
	}
	for _, ev := range evs {
		if ev.Kind == engine.EventFinished {
			fmt.Printf("request %d: %d prompt tokens, %d cached, TTFT %v\n",
				ev.ID, ev.Usage.PromptTokens, ev.Usage.CachedTokens, (ev.FirstTokenAt - ev.Arrival).Round(time.Millisecond))
		}
	}
	// Output:
	// request 0: 1050 prompt tokens, 0 cached, TTFT 155ms
	// request 1: 1050 prompt tokens, 992 cached, TTFT 172ms
}
