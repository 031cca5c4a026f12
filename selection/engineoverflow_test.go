package selection

import "testing"

// With EngineOverflow the overflow term reads the engine's reported KV
// usage plus this router's context reserved since the scrape, not its
// own in-flight contexts; with no figure (or without the option) it is
// the rule's.
func TestEngineOverflow(t *testing.T) {
	const bt = 16
	rt, cands := newTestRouter(t, Config{BlockTokens: bt}, 1)
	s := cands[0].Slot
	rt.SetCapacity(s, 16_000)
	eo := rt.WithOptions(Options{EngineOverflow: true})
	for i := range 3 {
		// 7,200 tokens each, 3,200 of them shared: resident 21,600
		// (no prompt extends another's).
		routeTo(t, rt, cands, 0, tokensOf(1, uint64(7+i), 200, 450))
	}
	rule := rt.load(s, 1_000)
	if got := eo.load(s, 1_000); got != rule {
		t.Fatalf("no engine figure: load %.0f, want the rule's %.0f", got, rule)
	}
	// The engine holds the shared prefix once: 15,200 tokens.
	rt.SetEngineKV(s, 15_200)
	if used, ok := rt.EngineKV(s); !ok || used != 15_200 {
		t.Fatalf("EngineKV = %d, %v; want 15200, true", used, ok)
	}
	if got := rt.load(s, 1_000); got != rule {
		t.Errorf("without the option: load %.0f, want the rule's %.0f", got, rule)
	}
	// Overflow 21,600 + 1,000 - 16,000 = 6,600 (x 4) by the rule;
	// 15,200 + 1,000 - 16,000 = 200 from the engine's figure.
	if want := 4.0 * (6_600 - 200); rule-eo.load(s, 1_000) != want {
		t.Errorf("rule %.0f, engine %.0f: differ by %.0f, want %.0f", rule, eo.load(s, 1_000), rule-eo.load(s, 1_000), want)
	}
	// A request reserved since the scrape counts its context on top
	// (7,200 tokens): overflow 200 + 7,200.
	res := routeTo(t, rt, cands, 0, tokensOf(1, 10, 200, 450))
	if got, want := eo.load(s, 1_000)-rt.load(s, 1_000), 4.0*(7_400-(6_600+7_200)); got != want {
		t.Errorf("after one more request: engine less rule %.0f, want %.0f", got, want)
	}
	res.Release()
	// Released again: back to the scrape's figure (the released context
	// lingers in the pair term of both).
	rule = rt.load(s, 1_000)
	if got, want := rule-eo.load(s, 1_000), 4.0*(6_600-200); got != want {
		t.Errorf("after its release: rule less engine %.0f, want %.0f", got, want)
	}
	// Stale: the rule again.
	rt.SetEngineKV(s, -1)
	if got := eo.load(s, 1_000); got != rule {
		t.Errorf("stale: load %.0f, want the rule's %.0f", got, rule)
	}
	rt.SetEngineKV(s, 0)
	rt.Unregister(rt.Key(s))
	if _, ok := rt.EngineKV(s); ok {
		t.Error("EngineKV set after Unregister")
	}
}
