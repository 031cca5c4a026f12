package selection

import "testing"

// QueueExtra adds QueueExtra x the replica's pending prefill to its load
// (and so moves a request off a replica queueing a cold prefill);
// QueueExtraRoom applies it only where the KV capacity holds that many
// mean prompts, QueueExtraFull only where the index is that full, and
// without QueueExtraWarm only for a request cold everywhere. The options
// below spell each gate out (negative: off) so that the defaults do not
// apply; TestQueueExtraDefault covers those.
func TestQueueExtra(t *testing.T) {
	// ungated is QueueExtra at weight w with no gate; rule is main's rule
	// before QueueExtra (IndexShare off too, so the index is the whole).
	ungated := func(w float64) Options {
		return Options{QueueExtra: w, QueueExtraRoom: -1, QueueExtraFull: -1, QueueExtraWarm: true, IndexShare: -1}
	}
	rule := Options{QueueExtra: -1, IndexShare: -1}
	pick := func(o Options, avg, capa int64) (Decision, []float64) {
		t.Helper()
		rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
		rt = rt.WithOptions(o)
		rt.SetCapacity(cands[0].Slot, capa)
		rt.SetCapacity(cands[1].Slot, 196_608)
		// Replica 0: one cold prompt pending (500 blocks of 16 tokens); replica 1:
		// three requests past their prefill, with their context.
		routeTo(t, rt, cands, 0, tokensOf(1, 1, 0, 500))
		for k := range 3 {
			r := routeTo(t, rt, cands, 1, tokensOf(uint64(10+k), uint64(10+k), 0, 2_000))
			r.PrefillDone()
		}
		if p := rt.loads[cands[0].Slot].pending.Load(); p != 8_000 {
			t.Fatalf("replica 0 pending %d, want 8000", p)
		}
		rt.promptAvg.Store(avg * promptAvgScale)
		s := NewScratch(2)
		d := rt.Pick(features(rt.Config(), tokensOf(99, 99, 0, 100), 0), cands, s)
		return d, append([]float64(nil), s.Load...)
	}
	d0, l0 := pick(rule, 1_000, 196_608)
	d1, l1 := pick(ungated(1), 1_000, 196_608)
	if got := l1[0] - l0[0]; got != 8_000 {
		t.Errorf("QueueExtra 1: replica 0's load up by %v, want 8000 (its pending prefill)", got)
	}
	if l1[1] != l0[1] {
		t.Errorf("QueueExtra 1: replica 1's load %v, want %v (nothing pending)", l1[1], l0[1])
	}
	if d0.Index != 0 || d1.Index != 1 {
		t.Errorf("picked %d without QueueExtra and %d with it, want 0 and 1", d0.Index, d1.Index)
	}
	// The room gate: 196,608 >= 24 x 1,000 applies it; < 24 x 10,000 not.
	withRoom := ungated(1)
	withRoom.QueueExtraRoom = 24
	if _, l := pick(withRoom, 1_000, 196_608); l[0] != l1[0] {
		t.Errorf("QueueExtraRoom 24, mean prompt 1,000: load %v, want %v", l[0], l1[0])
	}
	if _, l := pick(withRoom, 10_000, 196_608); l[0] != l0[0] {
		t.Errorf("QueueExtraRoom 24, mean prompt 10,000: load %v, want the rule's %v", l[0], l0[0])
	}
	// The full gate: replica 0's index holds its 500 blocks; at 196,608
	// tokens of capacity it is far from full (the rule), at 8,000 full.
	withFull := ungated(1)
	withFull.QueueExtraFull = 0.9
	if _, l := pick(withFull, 1_000, 196_608); l[0] != l0[0] {
		t.Errorf("QueueExtraFull 0.9, index far from full: load %v, want the rule's %v", l[0], l0[0])
	}
	_, lf0 := pick(rule, 1_000, 8_000)
	if _, l := pick(withFull, 1_000, 8_000); l[0]-lf0[0] != 8_000 {
		t.Errorf("QueueExtraFull 0.9, index full: load %v, want %v + 8000", l[0], lf0[0])
	}
	// The cold gate: the request shares nothing with either replica, so
	// without QueueExtraWarm it keeps the charge; a request replica 0
	// holds part of is scored as the rule.
	cold := ungated(1)
	cold.QueueExtraWarm = false
	if _, l := pick(cold, 1_000, 196_608); l[0] != l1[0] {
		t.Errorf("the cold gate, a cold request: load %v, want %v", l[0], l1[0])
	}
	warm := func(o Options) float64 {
		t.Helper()
		rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
		rt = rt.WithOptions(o)
		routeTo(t, rt, cands, 0, tokensOf(1, 1, 0, 500))
		s := NewScratch(2)
		rt.Pick(features(rt.Config(), tokensOf(1, 2, 100, 200), 0), cands, s)
		if s.Overlap[0] == 0 {
			t.Fatalf("the warm request has no overlap on replica 0")
		}
		return s.Load[0]
	}
	if a, b := warm(rule), warm(cold); a != b {
		t.Errorf("the cold gate, a warm request: load %v, want the rule's %v", b, a)
	}
	if a, b := warm(rule), warm(ungated(1)); b-a != 8_000 {
		t.Errorf("QueueExtra without the cold gate, a warm request: load %v, want %v + 8000", b, a)
	}
	// The defaults: the zero Options is QueueExtra 2 with its three gates
	// (and IndexShare 0.8 gated at 24 mean prompts). Replica 0's 8,000
	// tokens hold 24 prompts of 300 and its index is full: the charge is
	// twice its pending prefill; with prompts of 1,000 the room gate is shut.
	explicit := Options{IndexShare: DefaultIndexShare, IndexShareRoom: DefaultIndexShareRoom,
		QueueExtra: DefaultQueueExtra, QueueExtraRoom: DefaultQueueExtraRoom, QueueExtraFull: DefaultQueueExtraFull}
	_, lr := pick(rule, 300, 8_000)
	_, ld := pick(Options{}, 300, 8_000)
	_, le := pick(explicit, 300, 8_000)
	if ld[0]-lr[0] != 16_000 || ld[1] != lr[1] {
		t.Errorf("the default, a full index: loads %v, want the rule's %v with 16000 on replica 0", ld, lr)
	}
	if ld[0] != le[0] || ld[1] != le[1] {
		t.Errorf("the zero Options: loads %v, the defaults spelt out %v", ld, le)
	}
	if _, l := pick(Options{}, 1_000, 8_000); l[0] != lf0[0] {
		t.Errorf("the default, 8 mean prompts of room: load %v, want the rule's %v", l[0], lf0[0])
	}
	// Mixed profiles for a request that wants one (ProfileQueue's case):
	// QueueExtra stays off; the same request without max_tokens pays it.
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
	cands[1].Profile = ProfileSpeculative
	r := rt.Reserve(cands[0].Slot, 300)
	defer r.Release()
	loadOf := func(o Options, maxTokens int) float64 {
		s := NewScratch(2)
		rt.WithOptions(o).Pick(features(rt.Config(), blocksOf(31, 10), maxTokens), cands, s)
		return s.Load[0]
	}
	if a, b := loadOf(rule, 2000), loadOf(ungated(1), 2000); a != b {
		t.Errorf("mixed profiles, max_tokens set: load %v, want the rule's %v", b, a)
	}
	if a, b := loadOf(rule, 0), loadOf(ungated(1), 0); b-a != 300 {
		t.Errorf("mixed profiles, no max_tokens: load %v, want %v + 300", b, a)
	}
}

// IndexShare's default: the index models 0.8 of a replica's capacity
// where it holds 24 of the router's mean prompts, the whole where it holds
// fewer or with IndexShare negative.
func TestIndexShareDefault(t *testing.T) {
	for _, c := range []struct {
		o          Options
		capa, want int64
	}{
		{Options{}, 196_608, 157_280},
		{Options{}, 16_000, 16_000},
		{Options{IndexShare: -1}, 196_608, 196_608},
		{Options{IndexShareRoom: -1}, 16_000, 12_800},
		{Options{IndexShare: 0.5}, 196_608, 98_304},
	} {
		rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
		rt = rt.WithOptions(c.o)
		rt.promptAvg.Store(1_000 * promptAvgScale)
		rt.SetCapacity(cands[0].Slot, c.capa)
		if got := rt.Capacity(cands[0].Slot); got != c.want {
			t.Errorf("%+v, capacity %d: the index's %d, want %d", c.o, c.capa, got, c.want)
		}
	}
}
