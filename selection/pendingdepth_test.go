package selection

import "testing"

// TestPendingDepth: with Options.PendingDepth, the overlap of a replica
// still prefilling the agent's previous turn counts only what it held
// before that turn (here nothing), so the replica holding an earlier,
// computed turn wins; once the prefill is done the whole overlap counts
// again. Without the option the index's overlap counts whole.
func TestPendingDepth(t *testing.T) {
	rt0, cands := newTestRouter(t, Config{BlockTokens: 16}, 3)
	rt := rt0.WithOptions(Options{PendingDepth: true})
	s := NewScratch(len(cands))
	only := func(i int) []Candidate {
		o := append([]Candidate(nil), cands...)
		for k := range o {
			o[k].Usable = k == i
		}
		return o
	}
	turn := func(n int) *Features { // the agent's prompt: n blocks of its context
		return features(rt.Config(), blocksOf(1, n), 0)
	}
	// An earlier turn (300 blocks, 4,800 tokens), computed and ended on replica 1.
	_, old := rt.Route(turn(300), only(1), s, nil, nil)
	old.PrefillDone()
	old.Release()
	// Another agent's prompt prefilling on replica 1 takes nothing from
	// this agent's overlap there.
	_, other := rt.Route(features(rt.Config(), blocksOf(2, 100), 0), only(1), s, nil, nil)
	defer other.Release()
	// The previous turn (400 blocks) still prefilling on replica 0, cold there.
	d, prev := rt.Route(turn(400), only(0), s, nil, nil)
	if d.Index != 0 || d.Prefill != 6400 {
		t.Fatalf("previous turn: %+v", d)
	}
	next := turn(420)
	if d := rt0.Pick(next, cands, s); s.Overlap[0] != 6400 || s.Overlap[1] != 4800 {
		t.Fatalf("rule: %+v, overlaps %v, want 6400 and 4800", d, s.Overlap)
	}
	if d := rt.Pick(next, cands, s); d.Index != 1 || d.Overlap != 4800 || s.Overlap[0] != 0 || s.Overlap[2] != 0 {
		t.Fatalf("PendingDepth while the previous turn prefills: %+v, overlaps %v, want replica 1 at 4800 and replica 0 at 0", d, s.Overlap)
	}
	// A prompt that extends 3/4 of the previous turn's (its blocks past 300
	// rewritten) finds it too.
	fork := features(rt.Config(), append(blocksOf(1, 300), blocksOf(3, 60)...), 0)
	if rt.Pick(fork, cands, s); s.Overlap[0] != 0 || s.Overlap[1] != 4800 {
		t.Fatalf("a fork at 3/4: overlaps %v, want 0 on replica 0 and 4800 on replica 1", s.Overlap)
	}
	prev.PrefillDone()
	if d := rt.Pick(next, cands, s); d.Index != 0 || d.Overlap != 6400 {
		t.Fatalf("PendingDepth once the prefill is done: %+v, want replica 0 at 6400", d)
	}
	prev.Release()
}
