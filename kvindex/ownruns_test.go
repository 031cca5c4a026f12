package kvindex

import (
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// preciseOnA is a precise service of one engine, "a", on blocks of bs
// tokens, its clock *now, bound to a's slot s in a router rt of its own;
// closed when the test ends.
func preciseOnA(t *testing.T, bs int, now *time.Time) (p *Precise, rt *selection.Router, s selection.Slot) {
	t.Helper()
	p, err := NewPrecise(PreciseConfig{
		Index:   Config{BlockSize: bs, Now: func() time.Time { return *now }},
		Engines: []PreciseEngine{{Feed: Endpoint{Replica: "a"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if rt, err = selection.NewRouter(selection.Config{BlockTokens: bs}); err != nil {
		t.Fatal(err)
	}
	if s, err = rt.Register("a"); err != nil {
		t.Fatal(err)
	}
	p.Bind(s, "a")
	return p, rt, s
}

// A lone instance's own request stores more than its reservation credits
// when the engine recomputes its blocks (preempted, or its cached prefix
// evicted while it queued): the index still marks those blocks as this
// router's (a prediction confirmed, or an own block stored again after its
// eviction: ownMem), and SetForeign's estimate counts them as its own, not
// as another instance's prefill. A run of blocks this router never routed
// there is still foreign (bench/EXPERIMENTS.md, section 113).
func TestForeignOwnRecomputed(t *testing.T) {
	const bs = 16
	now := time.Unix(1000, 0)
	p, rt, s := preciseOnA(t, bs, &now)
	ra, _ := p.Index().Lookup("a")
	fp := selection.NewForeignPrefill()
	fp.SetRouter(rt)
	p.SetForeign(fp)

	const blocks = 8
	toks := make([]uint32, blocks*bs)
	hashes := make([]uint64, blocks)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	for i := range hashes {
		hashes[i] = uint64(100 + i)
	}
	// This router routes the request: its prediction of the prompt's
	// blocks on a, and the credit of its prefill (kept: its first token
	// just came, within Grace).
	p.Index().Hold(ra, p.Index().Keys(nil, 0, toks), time.Minute)
	fp.Routed(s, blocks*bs)
	fp.FirstToken(s, now)
	p.Index().Apply(ra, batchOf(storedEv(0, false, bs, toks, hashes...)))
	if tok, _ := fp.Counted(); tok != 0 {
		t.Fatalf("the credited first store: %d foreign tokens, want 0", tok)
	}
	// The engine evicts them while the request runs and recomputes them
	// (a preemption): the credit is spent, the blocks are still this
	// router's.
	now = now.Add(10 * time.Millisecond)
	p.Index().Apply(ra, batchOf(Event{Kind: KindBlockRemoved, BlockHashes: hashes, Medium: "GPU"}))
	now = now.Add(10 * time.Millisecond)
	p.Index().Apply(ra, batchOf(storedEv(0, false, bs, toks, hashes...)))
	if tok, runs := fp.Counted(); tok != 0 {
		t.Fatalf("own blocks recomputed: %d foreign tokens in %d runs, want 0", tok, runs)
	}
	// Another instance's prompt on a: foreign.
	other := make([]uint32, blocks*bs)
	for i := range other {
		other[i] = uint32(10000 + i)
	}
	oh := make([]uint64, blocks)
	for i := range oh {
		oh[i] = uint64(900 + i)
	}
	p.Index().Apply(ra, batchOf(storedEv(0, false, bs, other, oh...)))
	if tok, runs := fp.Counted(); tok != blocks*bs || runs != 1 {
		t.Fatalf("another instance's run: %d foreign tokens in %d runs, want %d in 1", tok, runs, blocks*bs)
	}
	if share := fp.Share(); share != 0.5 {
		t.Errorf("share %v, want 0.5 (128 foreign over 256 own)", share)
	}
}
