package selection

// moveBand applies Options.MoveBand and MoveStay to Pick's choice w, a
// load override of a long prompt's home (w holds less of the prompt than
// bestOverlap, what its warmest replica holds) once this instance has seen
// other instances: with MoveStay the home is kept while its score is
// within MoveStay of the best; with MoveBand the agent moves to the
// replica first in the rendezvous order of its own block (moveKey) among
// the non-home replicas scoring within MoveBand of the best, so that two
// instances moving the same agent pick the same replica.
func (rt *Router) moveBand(f *Features, cands []Candidate, s *Scratch, w int, best float64, bestOverlap, prompt int) int {
	if s.Overlap[w] >= bestOverlap || bestOverlap == 0 || prompt <= DefaultAgreeMax || !rt.SawOthers() {
		return w
	}
	if stay := rt.opt.MoveStay; stay > 0 {
		h := -1
		for i := range cands {
			if cands[i].Usable && s.Overlap[i] == bestOverlap && (h < 0 || s.Score[i] > s.Score[h]) {
				h = i
			}
		}
		if h >= 0 && s.Score[h] >= best-stay {
			return h
		}
	}
	band := rt.opt.MoveBand
	if band <= 0 {
		return w
	}
	key := rt.moveKey(f, cands, s)
	pick, top := w, rt.Rendezvous(key, cands[w].Slot)
	for i := range cands {
		if i == w || !cands[i].Usable || s.Overlap[i] >= bestOverlap || s.Score[i] < best-band {
			continue
		}
		if h := rt.Rendezvous(key, cands[i].Slot); h > top {
			pick, top = i, h
		}
	}
	return pick
}

// moveKey is the block moveBand hashes: the prompt's first block past
// what half the usable replicas hold (a fleet-wide prefix held widely),
// which an agent's split over two or three replicas does not move.
func (rt *Router) moveKey(f *Features, cands []Candidate, s *Scratch) uint64 {
	if len(f.Blocks) == 0 {
		return 0
	}
	usable := 0
	for i := range cands {
		if cands[i].Usable {
			usable++
		}
	}
	need := (usable + 1) / 2
	k := 0
	for i := range cands {
		if !cands[i].Usable || s.Overlap[i] <= k {
			continue
		}
		n := 0
		for j := range cands {
			if cands[j].Usable && s.Overlap[j] >= s.Overlap[i] {
				n++
			}
		}
		if n >= need {
			k = s.Overlap[i]
		}
	}
	return f.Blocks[min(k/rt.cfg.BlockTokens, len(f.Blocks)-1)]
}
