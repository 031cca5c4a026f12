package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// runAll steps e until idle (bounded) and returns all events.
func runAll(t *testing.T, e *Engine) []Event {
	t.Helper()
	var evs []Event
	for i := 0; i < 1_000_000; i++ {
		var ok bool
		evs, ok = e.Step(evs)
		if !ok {
			return evs
		}
	}
	t.Fatal("engine did not go idle")
	return nil
}

func finished(evs []Event) map[uint64]Event {
	m := make(map[uint64]Event)
	for _, ev := range evs {
		if ev.Kind == EventFinished {
			m[ev.ID] = ev
		}
	}
	return m
}

func mustSubmit(t *testing.T, e *Engine, r Request) {
	t.Helper()
	if err := e.Submit(r); err != nil {
		t.Fatalf("Submit(%d): %v", r.ID, err)
	}
}

func TestCacheHitAfterRepeatedPrefix(t *testing.T) {
	e := New(Config{})
	prompt := SyntheticTokens(nil, 1, 200)
	mustSubmit(t, e, Request{ID: 1, Prompt: prompt, MaxTokens: 4})
	first := finished(runAll(t, e))[1]
	if first.Usage.CachedTokens != 0 {
		t.Fatalf("cold request cached %d tokens", first.Usage.CachedTokens)
	}
	mustSubmit(t, e, Request{ID: 2, Prompt: prompt, MaxTokens: 4})
	second := finished(runAll(t, e))[2]
	// 199 tokens may come from cache (the last is recomputed): 12 full blocks.
	if got, want := second.Usage.CachedTokens, 192; got != want {
		t.Fatalf("repeated prompt cached %d tokens, want %d", got, want)
	}
	if ttft1, ttft2 := first.FirstTokenAt-first.Arrival, second.FirstTokenAt-second.Arrival; ttft2 >= ttft1 {
		t.Errorf("warm TTFT %v not below cold TTFT %v", ttft2, ttft1)
	}
	st := e.Stats()
	if st.PrefixQueries != 400 || st.PrefixHits != 192 {
		t.Errorf("prefix counters queries=%d hits=%d, want 400 and 192", st.PrefixQueries, st.PrefixHits)
	}
	if got := e.CachedPrefix(prompt); got != 192 {
		t.Errorf("CachedPrefix = %d, want 192", got)
	}
	if st.UsedBlocks != 0 || st.Running != 0 || st.KVUsage != 0 {
		t.Errorf("idle engine holds blocks: %+v", st)
	}
}

func TestChatTurnsReuseReply(t *testing.T) {
	e := New(Config{})
	tools := []string{`{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}`}
	msgs := []Message{
		{Role: "system", Content: SyntheticText(7, 300)},
		{Role: "user", Content: "What is the weather in Paris today?"},
	}
	p1 := RenderChat(nil, tools, msgs, true)
	reply := AssistantBody("", []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}})
	out := ReplyTokens(nil, reply)
	mustSubmit(t, e, Request{ID: 1, Prompt: p1, MaxTokens: len(out), Output: out})
	runAll(t, e)

	msgs = append(msgs,
		Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		Message{Role: "tool", ToolCallID: "call_1", Content: `{"temp":21}`},
	)
	p2 := RenderChat(nil, tools, msgs, true)
	prefix := append(append([]uint32(nil), p1...), out...)
	if diff := cmp.Diff(prefix, p2[:len(prefix)]); diff != "" {
		t.Fatalf("turn 2 does not begin with turn 1 + reply (-want +got):\n%s", diff)
	}
	mustSubmit(t, e, Request{ID: 2, Prompt: p2, MaxTokens: 8})
	got := finished(runAll(t, e))[2].Usage.CachedTokens
	if want := len(prefix) / 16 * 16; got != want {
		t.Fatalf("turn 2 cached %d tokens, want %d (all full blocks of turn 1 + reply)", got, want)
	}
}

func TestEvictionUnderCapacity(t *testing.T) {
	var kv []KVEvent
	e := New(Config{CapacityTokens: 64 * 16})
	e.SetKVEventHandler(func(ev KVEvent) { kv = append(kv, ev) })
	a := SyntheticTokens(nil, 1, 40*16+1)
	b := SyntheticTokens(nil, 2, 40*16+1)
	mustSubmit(t, e, Request{ID: 1, Prompt: a, MaxTokens: 1})
	runAll(t, e)
	if got := e.CachedPrefix(a); got != 40*16 {
		t.Fatalf("after a: CachedPrefix(a) = %d, want %d", got, 40*16)
	}
	mustSubmit(t, e, Request{ID: 2, Prompt: b, MaxTokens: 1})
	runAll(t, e)
	st := e.Stats()
	if st.CachedBlocks > st.TotalBlocks {
		t.Fatalf("cached %d blocks > capacity %d", st.CachedBlocks, st.TotalBlocks)
	}
	if got := e.CachedPrefix(b); got != 40*16 {
		t.Errorf("CachedPrefix(b) = %d, want %d", got, 40*16)
	}
	// b needed 41 blocks with 24 free: 17 of a's blocks went, deepest first,
	// so a's first 23 blocks are still cached.
	if got, want := e.CachedPrefix(a), 23*16; got != want {
		t.Errorf("CachedPrefix(a) after eviction = %d, want %d", got, want)
	}
	var stored, removed int
	for _, ev := range kv {
		switch ev.Kind {
		case BlockStored:
			stored += len(ev.BlockHashes)
			if len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
				t.Errorf("BlockStored with %d tokens for %d blocks", len(ev.TokenIDs), len(ev.BlockHashes))
			}
		case BlockRemoved:
			removed += len(ev.BlockHashes)
		}
	}
	if stored != 80 || removed != 17 {
		t.Errorf("events: %d stored, %d removed; want 80 and 17", stored, removed)
	}
	if st.CachedBlocks != stored-removed {
		t.Errorf("cached blocks %d != stored-removed %d", st.CachedBlocks, stored-removed)
	}
}

func TestKVEventChain(t *testing.T) {
	var kv []KVEvent
	e := New(Config{MaxBatchedTokens: 64})
	e.SetKVEventHandler(func(ev KVEvent) { kv = append(kv, ev) })
	p := SyntheticTokens(nil, 3, 160)
	mustSubmit(t, e, Request{ID: 1, Prompt: p, MaxTokens: 1})
	runAll(t, e)
	// Chunks of 64 tokens store 4 blocks per step; each event chains to
	// the previous one and carries the blocks' tokens.
	if len(kv) != 3 {
		t.Fatalf("got %d events, want 3: %+v", len(kv), kv)
	}
	var parent uint64
	for i, ev := range kv {
		if ev.Kind != BlockStored || ev.HasParent != (i > 0) || (i > 0 && ev.ParentHash != parent) {
			t.Fatalf("event %d: %+v (want parent %x)", i, ev, parent)
		}
		for j, h := range ev.BlockHashes {
			toks := ev.TokenIDs[j*16 : (j+1)*16]
			if want := HashBlock(0, parent, toks); h != want {
				t.Fatalf("event %d block %d hash %x, want %x", i, j, h, want)
			}
			parent = h
		}
	}
	if diff := cmp.Diff(p[:160], append(append(kv[0].TokenIDs, kv[1].TokenIDs...), kv[2].TokenIDs...)); diff != "" {
		t.Errorf("stored tokens differ from prompt:\n%s", diff)
	}
	e.Reset()
	if last := kv[len(kv)-1]; last.Kind != AllBlocksCleared {
		t.Errorf("Reset emitted %v, want AllBlocksCleared", last.Kind)
	}
	if e.CachedPrefix(p) != 0 || e.Stats().CachedBlocks != 0 {
		t.Error("cache not empty after Reset")
	}
}

func TestQueueingWhenSlotsFull(t *testing.T) {
	e := New(Config{MaxRunningSeqs: 2})
	for i := uint64(1); i <= 5; i++ {
		mustSubmit(t, e, Request{ID: i, Prompt: SyntheticTokens(nil, i, 100), MaxTokens: 50})
	}
	if got := e.Stats().PendingPrefillTokens; got != 500 {
		t.Errorf("pending prefill %d, want 500", got)
	}
	evs, _ := e.Step(nil)
	if e.Running() != 2 || e.Waiting() != 3 {
		t.Fatalf("running=%d waiting=%d, want 2 and 3", e.Running(), e.Waiting())
	}
	if got := e.Stats().PendingPrefillTokens; got != 300 {
		t.Errorf("pending prefill after the first step %d, want 300", got)
	}
	evs = append(evs, runAll(t, e)...)
	fin := finished(evs)
	if len(fin) != 5 {
		t.Fatalf("%d finished, want 5", len(fin))
	}
	// FIFO: the 3rd request starts only after the first two finished.
	if fin[3].FirstTokenAt < fin[1].At {
		t.Errorf("request 3 first token at %v before request 1 finished at %v", fin[3].FirstTokenAt, fin[1].At)
	}
	for id, ev := range fin {
		if ev.Usage.CompletionTokens != 50 || ev.Usage.PromptTokens != 100 {
			t.Errorf("request %d usage %+v", id, ev.Usage)
		}
	}
}

func TestSubmitErrors(t *testing.T) {
	e := New(Config{MaxModelLen: 1000, MaxWaiting: 1, CapacityTokens: 512})
	tests := []struct {
		name string
		give Request
		want error
	}{
		{"empty", Request{ID: 1, MaxTokens: 1}, ErrEmptyPrompt},
		{"no output", Request{ID: 1, Prompt: []uint32{1}}, ErrBadMaxTokens},
		{"too long", Request{ID: 1, Prompt: make([]uint32, 990), MaxTokens: 20}, ErrContextLength},
		{"too large", Request{ID: 1, Prompt: make([]uint32, 600), MaxTokens: 1}, ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := e.Submit(tt.give); !errors.Is(err, tt.want) {
				t.Errorf("Submit: %v, want %v", err, tt.want)
			}
		})
	}
	mustSubmit(t, e, Request{ID: 1, Prompt: []uint32{1, 2}, MaxTokens: 1})
	if err := e.Submit(Request{ID: 2, Prompt: []uint32{1, 2}, MaxTokens: 1}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("second Submit: %v, want ErrQueueFull", err)
	}
}

// tpot returns the mean time per output token over all requests run at the
// given concurrency.
func tpot(t *testing.T, cfg Config, conc int) time.Duration {
	cfg.MaxRunningSeqs = 64
	e := New(cfg)
	for i := 0; i < conc; i++ {
		mustSubmit(t, e, Request{ID: uint64(i), Prompt: SyntheticTokens(nil, uint64(i), 1000), MaxTokens: 256})
	}
	var sum time.Duration
	for _, ev := range finished(runAll(t, e)) {
		sum += (ev.At - ev.FirstTokenAt) / 255
	}
	return sum / time.Duration(conc)
}

func TestSpeculativeGainShrinksWithBatch(t *testing.T) {
	spec := Config{SpecTokens: 3, SpecAcceptance: 0.7}
	gain := func(conc int) float64 {
		return float64(tpot(t, Config{}, conc)) / float64(tpot(t, spec, conc))
	}
	g1, g32 := gain(1), gain(32)
	t.Logf("speculative speed-up: %.2fx at 1, %.2fx at 32", g1, g32)
	if g1 <= 1.5 {
		t.Errorf("speed-up at concurrency 1 = %.2f, want > 1.5", g1)
	}
	if g32 >= g1 {
		t.Errorf("speed-up at 32 (%.2f) not below speed-up at 1 (%.2f)", g32, g1)
	}
	e := New(spec)
	mustSubmit(t, e, Request{ID: 1, Prompt: []uint32{1, 2, 3}, MaxTokens: 100})
	runAll(t, e)
	st := e.Stats()
	rate := float64(st.SpecAcceptedTokens) / float64(st.SpecDraftTokens)
	if st.SpecDrafts == 0 || rate < 0.4 || rate > 0.8 {
		t.Errorf("spec counters %+v (acceptance %.2f)", st, rate)
	}
	if st.GenerationTokens != 100 {
		t.Errorf("generated %d tokens, want exactly 100", st.GenerationTokens)
	}
}

func TestDecodeSlowsWithBatchAndPrefillWithContext(t *testing.T) {
	if a, b := tpot(t, Config{}, 1), tpot(t, Config{}, 26); b <= a {
		t.Errorf("TPOT at 26 (%v) not above TPOT at 1 (%v)", b, a)
	}
	ttft := func(n int) time.Duration {
		e := New(Config{})
		mustSubmit(t, e, Request{ID: 1, Prompt: SyntheticTokens(nil, 1, n), MaxTokens: 1})
		ev := finished(runAll(t, e))[1]
		return ev.FirstTokenAt - ev.Arrival
	}
	short, long := ttft(1000), ttft(32000)
	if perShort, perLong := short/1000, long/32000; perLong <= perShort {
		t.Errorf("prefill per token at 32k (%v) not above at 1k (%v)", perLong, perShort)
	}
}

func TestPreemptionUnderMemoryPressure(t *testing.T) {
	e := New(Config{CapacityTokens: 100 * 16, MaxRunningSeqs: 8})
	for i := uint64(1); i <= 6; i++ {
		mustSubmit(t, e, Request{ID: i, Prompt: SyntheticTokens(nil, i, 200), MaxTokens: 200})
	}
	evs := runAll(t, e)
	if n := len(finished(evs)); n != 6 {
		t.Fatalf("%d finished, want 6", n)
	}
	st := e.Stats()
	if st.Preemptions == 0 {
		t.Error("no preemption although 6 x 25 blocks exceed 100")
	}
	if st.UsedBlocks != 0 {
		t.Errorf("%d blocks still used", st.UsedBlocks)
	}
	for id, ev := range finished(evs) {
		if ev.Usage.CompletionTokens != 200 {
			t.Errorf("request %d generated %d tokens", id, ev.Usage.CompletionTokens)
		}
	}
}

func TestAbortReleasesBlocks(t *testing.T) {
	e := New(Config{})
	mustSubmit(t, e, Request{ID: 1, Prompt: SyntheticTokens(nil, 1, 500), MaxTokens: 100})
	mustSubmit(t, e, Request{ID: 2, Prompt: SyntheticTokens(nil, 2, 500), MaxTokens: 100})
	e.Step(nil) // both in prefill, then in flight again
	if _, ok := e.NextEventTime(); !ok {
		t.Fatal("engine idle")
	}
	if !e.Abort(1) || e.Abort(1) {
		t.Fatal("Abort(1) should succeed once")
	}
	evs := runAll(t, e)
	fin := finished(evs)
	if _, ok := fin[1]; ok || len(fin) != 1 {
		t.Fatalf("finished %v, want only request 2", fin)
	}
	if st := e.Stats(); st.UsedBlocks != 0 || st.Running != 0 {
		t.Errorf("after abort: %+v", st)
	}
}

func TestChunkedPrefill(t *testing.T) {
	e := New(Config{})
	mustSubmit(t, e, Request{ID: 1, Prompt: SyntheticTokens(nil, 1, 20000), MaxTokens: 1})
	steps := 0
	for {
		evs, ok := e.Step(nil)
		if !ok {
			break
		}
		steps++
		if steps < 3 && len(evs) != 0 {
			t.Fatalf("step %d produced %v before prefill finished", steps, evs)
		}
	}
	if steps != 3 {
		t.Errorf("20000-token prompt took %d steps with budget 8192, want 3", steps)
	}
}

// workload runs a fixed mixed workload with arrivals over time and
// returns every event and KV event.
func workload(cfg Config) ([]Event, []KVEvent) {
	var kv []KVEvent
	e := New(cfg)
	e.SetKVEventHandler(func(ev KVEvent) { kv = append(kv, ev) })
	sys := SyntheticTokens(nil, 99, 900)
	var evs []Event
	for i := 0; i < 60; i++ {
		at := time.Duration(i) * 37 * time.Millisecond
		evs = e.AdvanceTo(at, evs)
		p := SyntheticTokens(append([]uint32(nil), sys[:(i%3)*300]...), uint64(i), 100+i*13)
		if err := e.Submit(Request{ID: uint64(i), Prompt: p, MaxTokens: 20 + i%50}); err != nil {
			panic(err)
		}
	}
	for i := 0; i < 100000; i++ {
		t, ok := e.NextEventTime()
		if !ok {
			break
		}
		evs = e.AdvanceTo(t, evs)
	}
	return evs, kv
}

func TestDeterminism(t *testing.T) {
	cfg := Config{SpecTokens: 2, CapacityTokens: 300 * 16, MaxRunningSeqs: 8}
	evs1, kv1 := workload(cfg)
	evs2, kv2 := workload(cfg)
	if diff := cmp.Diff(evs1, evs2); diff != "" {
		t.Errorf("events differ between runs:\n%s", diff)
	}
	if diff := cmp.Diff(kv1, kv2); diff != "" {
		t.Errorf("KV events differ between runs:\n%s", diff)
	}
	if n := len(finished(evs1)); n != 60 {
		t.Errorf("%d finished, want 60", n)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		give Config
		want string
	}{
		{"defaults", DefaultConfig(), ""},
		{"acceptance", Config{SpecTokens: 2, SpecAcceptance: 1.5}, "SpecAcceptance"},
		{"tiny capacity", Config{CapacityTokens: 3}, "CapacityTokens"},
		{"negative spec", Config{SpecTokens: -1}, "SpecTokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.give
			c.SetDefaults()
			err := c.Validate()
			if (err == nil) != (tt.want == "") || (err != nil && !contains(err.Error(), tt.want)) {
				t.Errorf("Validate() = %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
