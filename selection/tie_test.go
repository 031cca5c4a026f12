package selection

import "testing"

// prompts of a family: a shared 4-block system prompt, then family-specific
// blocks.
func sysPrompt(family uint64, n int) []uint64 {
	toks := make([]uint32, 4+n)
	for i := range toks {
		toks[i] = uint32(i)
		if i >= 4 {
			toks[i] = uint32(family)*1_000_003 + uint32(i)
		}
	}
	return AppendTokenBlocks(nil, 1, toks, 1)
}

// A system prompt every replica holds does not fix one replica order: ties
// hash the first block not every usable replica holds, so requests that
// differ after it spread, requests that share more agree, and two
// independent routers that know the same fleet-wide prefix agree too.
func TestTieKeySpreadsPastFleetWidePrefix(t *testing.T) {
	c := Config{BlockTokens: 1, PrefixTokens: 1024}
	routers := make([]*Router, 2)
	var cands []Candidate
	for i := range routers {
		routers[i], cands = newTestRouter(t, c, 8)
		for _, cd := range cands {
			routers[i].Index().Learn(sysPrompt(0, 0), cd.Slot)
		}
	}
	legacy := routers[0].WithOptions(Options{FirstBlockTie: true})
	s := NewScratch(8)
	used, usedLegacy := map[Slot]bool{}, map[Slot]bool{}
	for fam := uint64(1); fam <= 64; fam++ {
		f := features(routers[0].Config(), sysPrompt(fam, 3), 0)
		d := routers[0].Pick(f, cands, s)
		if d.Tie != TieRendezvous || d.Overlap != 4 {
			t.Fatalf("family %d: %v/%v overlap %d, want a rendezvous tie at the system prompt", fam, d.Reason, d.Tie, d.Overlap)
		}
		used[d.Slot] = true
		if d2 := routers[1].Pick(f, cands, s); d2.Slot != d.Slot {
			t.Fatalf("family %d: independent routers disagree (%d, %d)", fam, d.Slot, d2.Slot)
		}
		// The same family with another question goes to the same replica.
		g := sysPrompt(fam, 5)
		g[len(g)-1] ^= 1
		if d3 := routers[0].Pick(features(routers[0].Config(), g, 0), cands, s); d3.Slot != d.Slot {
			t.Fatalf("family %d: a longer prompt of the family went to %d, not %d", fam, d3.Slot, d.Slot)
		}
		usedLegacy[legacy.Pick(f, cands, s).Slot] = true
	}
	if len(used) < 7 || len(usedLegacy) != 1 {
		t.Fatalf("ties used %d replicas (first-block rule: %d), want >= 7 (1)", len(used), len(usedLegacy))
	}
}
