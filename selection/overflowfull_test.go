package selection

import "testing"

// Under OverflowFull (on by default) the overflow term's weight drops
// where no replica has room for the prompt: an agent's next turn then
// stays on its home (4,800 of its 5,440 tokens there) rather than going
// cold to a replica that overflows by less. Where another replica has
// room, the rule's weight still moves it there. The gates keep the rule
// for a request without a home (OverflowFullHome: the home's lead under
// that share of the prompt) and on replicas large against the mean prompt
// (OverflowFullRoom: the capacity, 8,000, at least that many mean prompts
// of about 5,000).
func TestOverflowFull(t *testing.T) {
	const bt = 16
	for _, tt := range []struct {
		name  string
		other int // blocks in flight on replica 1
		opt   Options
		want  int
	}{
		{"full fleet, rule", 375, Options{OverflowFull: -1}, 1},
		{"full fleet, default", 375, Options{}, 0},
		{"full fleet, OverflowFull 1 ungated", 375, Options{OverflowFull: 1, OverflowFullHome: -1, OverflowFullRoom: -1}, 0},
		{"full fleet, home lead under 0.9 of the prompt", 375, Options{OverflowFullHome: 0.9}, 1},
		{"full fleet, capacity over 1.5 mean prompts", 375, Options{OverflowFullRoom: 1.5}, 1},
		{"full fleet, capacity under 2 mean prompts", 375, Options{OverflowFullRoom: 2}, 0},
		{"room elsewhere, rule", 125, Options{OverflowFull: -1}, 1},
		{"room elsewhere, default", 125, Options{}, 1},
	} {
		rt, cands := newTestRouter(t, Config{BlockTokens: bt}, 2)
		rt = rt.WithOptions(tt.opt)
		for _, c := range cands {
			rt.SetCapacity(c.Slot, 8_000)
		}
		routeTo(t, rt, cands, 0, tokensOf(1, 7, 0, 300)).PrefillDone()      // the agent's context: 4,800 tokens
		routeTo(t, rt, cands, 0, tokensOf(2, 8, 0, 250)).PrefillDone()      // another's: 4,000
		routeTo(t, rt, cands, 1, tokensOf(3, 9, 0, tt.other)).PrefillDone() // 6,000 or 2,000
		f := features(rt.Config(), tokensOf(1, 7, 0, 340), 0)               // the next turn: 5,440
		full, kv, n := rt.fleetFull(cands, f.PromptTokens(rt.Config()))
		if full != (tt.other == 375) || full && (kv != 16_000 || n != 2) {
			t.Errorf("%s: fleetFull %v, %d tokens over %d replicas", tt.name, full, kv, n)
		}
		d := rt.Pick(f, cands, NewScratch(len(cands)))
		if d.Index != tt.want {
			t.Errorf("%s: picked %d (overlap %d, load %.0f), want %d", tt.name, d.Index, d.Overlap, d.Load, tt.want)
		}
	}
}

// IndexShare bounds the index's model of a replica's prefix cache to that
// share of its KV capacity, and leaves the load's capacity whole; 0 is
// DefaultIndexShare, negative or 1 and more the rule (IndexShareRoom's
// gate off here: TestIndexShareDefault has it).
func TestIndexShare(t *testing.T) {
	for _, tt := range []struct {
		share     float64
		wantIndex int64
	}{
		{-1, 196_608},
		{1, 196_608},
		{0.8, 157_280}, // 157,286 tokens, whole 16-token blocks
		{0, 157_280},
	} {
		rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
		rt = rt.WithOptions(Options{IndexShare: tt.share, IndexShareRoom: -1})
		rt.SetCapacity(cands[0].Slot, 196_608)
		if got := rt.Capacity(cands[0].Slot); got != tt.wantIndex {
			t.Errorf("share %v: index capacity %d tokens, want %d", tt.share, got, tt.wantIndex)
		}
		if got := rt.loads[cands[0].Slot].kv(); got != 196_608 {
			t.Errorf("share %v: load capacity %d tokens, want 196608", tt.share, got)
		}
	}
}

// IndexShareRoom applies IndexShare only while the replica's capacity is
// at least that many mean prompts: the index's bound follows the mean as
// reservations move it, whole before any prompt is known.
func TestIndexShareRoom(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
	rt = rt.WithOptions(Options{IndexShare: 0.8, IndexShareRoom: 8})
	s := cands[0].Slot
	rt.SetCapacity(s, 196_608)
	if got := rt.Capacity(s); got != 196_608 {
		t.Errorf("no prompt yet: index capacity %d, want 196608", got)
	}
	for _, tt := range []struct {
		avg  int64
		want int64
	}{
		{10_000, 157_280}, // 196,608 >= 8 x 10,000: the share
		{30_000, 196_608}, // 196,608 < 8 x 30,000: whole
		{20_000, 157_280},
	} {
		rt.promptAvg.Store(tt.avg * promptAvgScale)
		rt.reapplyIndexShare()
		if got := rt.Capacity(s); got != tt.want {
			t.Errorf("mean prompt %d: index capacity %d, want %d", tt.avg, got, tt.want)
		}
	}
	// A reservation notes its prompt and re-applies the gate.
	routeTo(t, rt, cands, 0, tokensOf(1, 7, 0, 4_000)) // 64,000 tokens: the mean moves up by 1/64
	if got := rt.promptAvg.Load() / promptAvgScale; got <= 20_000 {
		t.Errorf("mean prompt %d after a 64,000-token reservation, want above 20,000", got)
	}
}
