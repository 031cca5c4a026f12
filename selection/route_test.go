package selection

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// exactAnnotator gives candidate 0 a fixed exact overlap when the request
// carries token ids, and records what it was told.
type exactAnnotator struct {
	overlap  int
	decided  int
	lastSlot Slot
}

func (a *exactAnnotator) Annotate(_ *Features, cands []Candidate, s *Scratch) bool {
	for i := range cands {
		cands[i].Precise = false
	}
	if s.Tokens == nil {
		return false
	}
	cands[0].Precise, cands[0].Overlap = true, a.overlap
	s.Keys = append(s.Keys[:0], uint64(len(s.Tokens)))
	return true
}

func (a *exactAnnotator) Decided(_ *Features, _ []Candidate, d Decision, s *Scratch) {
	if len(s.Keys) != 1 {
		panic("Decided without Annotate's scratch")
	}
	a.decided++
	a.lastSlot = d.Slot
}

// TestRouteIsPickReserveLearn checks that Route takes the decision Pick
// takes, reserves its prefill on the chosen replica and teaches the index.
func TestRouteIsPickReserveLearn(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 4)
	prompt := blocksOf(3, 64)
	rt.Index().Learn(prompt[:32], cands[2].Slot)
	f := features(rt.Config(), prompt, 0)
	s := NewScratch(4)
	want := rt.Pick(f, cands, s)
	var storage Reservation
	d, res := rt.Route(f, cands, s, nil, &storage)
	if diff := cmp.Diff(want, d); diff != "" {
		t.Fatalf("Route decision differs from Pick (-want +got):\n%s", diff)
	}
	if res != &storage || res.Slot() != cands[2].Slot {
		t.Fatalf("reservation %p on slot %d, want the caller's storage on slot %d", res, res.Slot(), cands[2].Slot)
	}
	if in, pend := rt.Load(d.Slot); in != 1 || pend != int64(want.Prefill) {
		t.Fatalf("load after Route: %d in flight, %d pending; want 1, %d", in, pend, want.Prefill)
	}
	res.Release()
	if in, pend := rt.Load(d.Slot); in != 0 || pend != 0 {
		t.Fatalf("load after release: %d, %d", in, pend)
	}
	if got := rt.Pick(f, cands, s); got.Slot != d.Slot || got.Overlap != len(prompt)*16 {
		t.Fatalf("after Route the index should hold the whole prompt on slot %d: %+v", d.Slot, got)
	}
}

// TestRouteAnnotator checks the precise-path contract: the exact overlap
// decides, Decided is called only after an annotated decision, and no
// usable candidate gives no reservation.
func TestRouteAnnotator(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 3)
	prompt := blocksOf(4, 64)
	rt.Index().Learn(prompt, cands[1].Slot) // the estimate says replica 1
	f := features(rt.Config(), prompt, 0)
	s := NewScratch(3)
	a := &exactAnnotator{overlap: 64 * 16}

	d, res := rt.Route(f, cands, s, a, nil)
	if d.Precise || a.decided != 0 || d.Slot != cands[1].Slot {
		t.Fatalf("without token ids: %+v, decided %d; want the estimate's replica 1, not precise", d, a.decided)
	}
	res.Release()

	// With token ids, the exact overlap says replica 0 holds the whole
	// prompt, and the estimate still says replica 1: a tie on overlap.
	// Replica 1 was just taught again by the first Route; release-only.
	s.Tokens = []uint32{1, 2, 3}
	d, res = rt.Route(f, cands, s, a, nil)
	if !d.Precise || a.decided != 1 || a.lastSlot != d.Slot {
		t.Fatalf("with token ids: %+v, decided %d (slot %d)", d, a.decided, a.lastSlot)
	}
	res.Release()

	for i := range cands {
		cands[i].Usable = false
	}
	d, res = rt.Route(f, cands, s, a, nil)
	if res != nil || d.Index != -1 || d.Reason != ReasonNone {
		t.Fatalf("no usable replica: %+v, reservation %v", d, res)
	}
}

// TestRouteOptions checks the marginal variant and context_weight through
// Route.
func TestRouteOptions(t *testing.T) {
	c := Config{BlockTokens: 16, PrefixTokens: 16 * 1024, AffinityCap: 512}
	rt, cands := newTestRouter(t, c, 2)
	// Both replicas hold a 512-token system prompt; replica 1 also holds
	// the next 256 tokens. The plain rule sees both at the cap and ties;
	// the marginal rule sees 0 and 256.
	prompt := blocksOf(5, 64)
	rt.Index().Learn(prompt[:32], cands[0].Slot)
	rt.Index().Learn(prompt[:48], cands[1].Slot)
	f := features(rt.Config(), prompt, 0)
	s := NewScratch(2)
	m := rt.WithOptions(Options{Marginal: true})
	d, res := m.Route(f, cands, s, nil, nil)
	if d.Slot != cands[1].Slot || d.Overlap != 256 {
		t.Fatalf("marginal: %+v, want replica 1 with 256 marginal tokens", d)
	}
	if _, pend := rt.Load(d.Slot); pend != int64(64*16-48*16) {
		t.Fatalf("marginal reservation counts %d pending tokens, want the real prefill %d", pend, 64*16-48*16)
	}
	res.Release()

	cc := rt.Config()
	cc.ContextWeight = 0.5
	cw, err := rt.Retune(cc)
	if err != nil {
		t.Fatal(err)
	}
	d, res = cw.Route(f, cands, s, nil, nil)
	pt := float64(f.PromptTokens(rt.Config()))
	want := float64(rt.Config().RequestCost) + float64(d.Prefill) + 0.5*pt*pt/AssumedKVTokens
	if got := cw.load(d.Slot, 0); got != want {
		t.Fatalf("context weight: load %v, want %v", got, want)
	}
	res.PrefillDone()
	if got := cw.load(d.Slot, 0); got != want-float64(d.Prefill) {
		t.Fatalf("context weight after prefill: load %v, want %v", got, want-float64(d.Prefill))
	}
	// With the replica's capacity known, the context weighs by the share
	// of it that it fills.
	cw.SetCapacity(d.Slot, 2048)
	if got, w := cw.load(d.Slot, 0), float64(rt.Config().RequestCost)+0.5*pt*pt/2048; got != w {
		t.Fatalf("context weight with a 2048-token KV: load %v, want %v", got, w)
	}
	if rt.Resident(d.Slot) != int64(pt) {
		t.Fatalf("resident %d, want the prompt's %v tokens", rt.Resident(d.Slot), pt)
	}
	res.Release()
	if got := cw.load(d.Slot, 0); got != 0 {
		t.Fatalf("context weight after release: load %v", got)
	}
}

func TestRouteDoesNotAllocate(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 8)
	prompt := blocksOf(1, 1024)
	for i, cd := range cands {
		rt.Index().Learn(prompt[:i*100], cd.Slot)
	}
	f := features(rt.Config(), prompt, 300)
	s := NewScratch(8)
	s.Tokens = []uint32{1}
	a := &exactAnnotator{overlap: 100}
	var res Reservation
	for _, opt := range []Options{{}, {Marginal: true}} {
		r := rt.WithOptions(opt)
		allocs := testing.AllocsPerRun(200, func() {
			_, got := r.Route(f, cands, s, a, &res)
			got.Release()
		})
		if allocs != 0 {
			t.Fatalf("Route %+v allocates %v times per decision", opt, allocs)
		}
	}
}
