package selection

import (
	"testing"
	"time"
)

func TestSetExternalPrefillCountsInLoad(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
	f := features(rt.Config(), blocksOf(1, 8), 100)
	s := NewScratch(len(cands))
	rt.SetExternalPrefill(cands[0].Slot, 3000)
	if got := rt.ExternalPrefill(cands[0].Slot); got != 3000 {
		t.Fatalf("ExternalPrefill = %d, want 3000", got)
	}
	d := rt.Pick(f, cands, s)
	if s.Load[0] != 3000 || s.Load[1] != 0 {
		t.Fatalf("loads = %v, want [3000 0]", s.Load)
	}
	if d.Slot != cands[1].Slot {
		t.Fatalf("picked slot %d, want the unloaded %d", d.Slot, cands[1].Slot)
	}
	rt.SetExternalPrefill(cands[0].Slot, -5)
	if got := rt.ExternalPrefill(cands[0].Slot); got != 0 {
		t.Fatalf("negative prefill stored as %d", got)
	}
	rt.SetExternalPrefill(cands[0].Slot, 1<<40)
	if got := rt.ExternalPrefill(cands[0].Slot); got != maxExternalPrefill {
		t.Fatalf("huge prefill stored as %d, want %d", got, maxExternalPrefill)
	}
	// The external load setter leaves it alone; Unregister drops it.
	rt.SetExternalLoad(cands[0].Slot, 1, 1, 0)
	if got := rt.ExternalPrefill(cands[0].Slot); got != maxExternalPrefill {
		t.Fatalf("SetExternalLoad changed the prefill to %d", got)
	}
	rt.Unregister(rt.Key(cands[0].Slot))
	if got := rt.ExternalPrefill(cands[0].Slot); got != 0 {
		t.Fatalf("prefill after Unregister = %d", got)
	}
}

// With SpillBand, instances named apart spread a spill over the
// candidates within the band of the best; position 0 (one instance) keeps
// the plain rule's choice.
func TestSpillBand(t *testing.T) {
	c := Config{BlockTokens: 16}
	rt0, cands := newTestRouter(t, c, 4)
	f := features(rt0.Config(), blocksOf(3, 32), 100)
	// Replica 0 holds the prompt but is loaded; 1-3 are cold, with
	// slightly different loads (a stale scrape): the plain rule takes the
	// least loaded.
	rt0.Learn(f, cands[0].Slot)
	rt0.SetExternalPrefill(cands[0].Slot, 10000)
	rt0.SetExternalPrefill(cands[2].Slot, 100)
	rt0.SetExternalPrefill(cands[3].Slot, 200)
	s := NewScratch(len(cands))
	plain := rt0.Pick(f, cands, s)
	if plain.Slot != cands[1].Slot {
		t.Fatalf("plain rule picked %d, want the least loaded %d", plain.Slot, cands[1].Slot)
	}
	// SpillBandAlone: the band's spread itself (TestSpillBandWaitsForOthers
	// tests when a lone instance applies it).
	banded := rt0.WithOptions(Options{SpillBand: 512, SpillBandAlone: true})
	if d := banded.Pick(f, cands, s); d.Slot != plain.Slot {
		t.Fatalf("position 0 with a band picked %d, want %d", d.Slot, plain.Slot)
	}
	used := map[Slot]bool{}
	for k, id := range []string{"r-0", "r-1", "r-2", "r-3"} {
		rt := banded.WithOptions(Options{SpillBand: 512, SpillBandAlone: true})
		rt.SetInstance(id)
		d := rt.Pick(f, cands, s)
		if d.Slot == cands[0].Slot {
			t.Fatalf("instance %d picked the loaded warm replica", k)
		}
		used[d.Slot] = true
		rt.SetInstance("")
	}
	if len(used) < 2 {
		t.Fatalf("4 instances with a band used %d replica(s), want them spread", len(used))
	}
}

// TestSpillBandWaitsForOthers: the band spill applies only once this
// instance has seen load it did not reserve (another instance's prefill,
// context or engine-reported requests) or answers showing other instances:
// a lone instance named by its host name (a non-zero position) decides as
// position 0 does until then. SpillBandAlone keeps the rule before.
func TestSpillBandWaitsForOthers(t *testing.T) {
	c := Config{BlockTokens: 16}
	rt0, cands := newTestRouter(t, c, 4)
	f := features(rt0.Config(), blocksOf(3, 32), 100)
	// As TestSpillBand, with this instance's own reservations: replica 0
	// holds the prompt but is loaded, 1-3 are cold with slightly
	// different loads; the plain rule takes the least loaded.
	rt0.Learn(f, cands[0].Slot)
	for i, p := range []int{10000, 0, 100, 200} {
		if p > 0 {
			rt0.Reserve(cands[i].Slot, p)
		}
	}
	s := NewScratch(len(cands))
	plain := rt0.Pick(f, cands, s)
	var id string
	for k := range 64 {
		// An instance id whose band spill moves this decision.
		rt := rt0.WithOptions(Options{SpillBand: 4096, SpillBandAlone: true})
		id = "host-" + string(rune('a'+k%26)) + string(rune('a'+k/26))
		rt.SetInstance(id)
		d := rt.Pick(f, cands, s)
		rt.SetInstance("")
		if d.Slot != plain.Slot {
			break
		}
		id = ""
	}
	if id == "" {
		t.Fatal("no instance id moved the decision: the test's premise")
	}
	rt := rt0.WithOptions(Options{SpillBand: 4096})
	rt.SetInstance(id)
	defer rt.SetInstance("")
	if rt.SawOthers() {
		t.Fatal("a fresh router saw others")
	}
	if d := rt.Pick(f, cands, s); d.Slot != plain.Slot {
		t.Fatalf("alone at %s: picked %d, want position 0's %d", id, d.Slot, plain.Slot)
	}
	// An estimate alone is not evidence, nor a lone instance's few own
	// runs misread as foreign (rho under ForeignEvidenceShare).
	a := cands[0].Slot
	rt.SetExternalContext(a, 1)
	rt.SetExternalPrefill(a, 1)
	fp := NewForeignPrefill()
	fp.SetRouter(rt)
	t0 := time.Unix(100, 0)
	fp.Routed(a, 10000)
	fp.StoredRun(a, 625, 16, t0) // 10,000 tokens, all this instance's own
	fp.Routed(a, 1000)
	fp.StoredRun(a, 125, 16, t0) // 2,000: 1,000 own, 1,000 read as foreign (rho 0.09)
	if rt.SawOthers() {
		t.Fatalf("rho %.2f (under %.2f) counted as another instance", fp.Share(), ForeignEvidenceShare)
	}
	fp.StoredRun(a, 125, 16, t0) // 2,000 more foreign: rho 0.27
	if !rt.SawOthers() {
		t.Fatalf("rho %.2f did not count as another instance", fp.Share())
	}
	rt.SetExternalPrefill(a, 0) // the decision below as before, with the evidence only
	rt.SetExternalContext(a, 0)
	if d := rt.Pick(f, cands, s); d.Slot == plain.Slot {
		t.Fatalf("with others seen at %s: picked %d, want the band's spill", id, d.Slot)
	}
}
