package selection

// Annotator supplies exact overlaps to Route: the precise path (package
// kvindex) implements it from the engines' own KV-cache events.
//
// Route calls Annotate before scoring. It sets Precise and Overlap on every
// candidate whose overlap it knows exactly and clears Precise on the
// others, reading the request's token ids from s.Tokens (nil when no
// tokenize preflight succeeded: it then annotates nothing) and using
// s.Keys and s.Exact as working memory. It reports whether any candidate
// got an exact overlap. When it did, Route calls Decided with the
// decision, before returning, so that the annotator can record what the
// chosen replica is about to hold (predicted entries). Neither may retain
// cands or s past the call. Both are called on the caller's goroutine, and
// concurrently for different requests: implementations must be safe for
// concurrent use, and should not allocate.
type Annotator interface {
	Annotate(f *Features, cands []Candidate, s *Scratch) bool
	Decided(f *Features, cands []Candidate, d Decision, s *Scratch)
}

// Route is one routing decision with its side effects: Annotate (when a
// is not nil), Pick, Reserve on the chosen replica, Learn (the approximate
// index now believes it holds the prompt) and Decided. It returns the
// decision and the reservation, nil when no candidate is usable.
//
// res is caller-owned storage for the reservation (a field of the
// per-request state, say), not in use by an earlier request; nil makes
// Route allocate one. Route allocates nothing once s has room for
// len(cands) and res is given.
//
// The Router's Options apply (Marginal picks a second time over overlaps
// relative to the least warm usable replica). The reservation keeps the
// prompt's tokens resident on the replica until it is released (the
// decode side of load(r), Config.ContextWeight).
func (rt *Router) Route(f *Features, cands []Candidate, s *Scratch, a Annotator, res *Reservation) (Decision, *Reservation) {
	precise := false
	if a != nil {
		precise = a.Annotate(f, cands, s)
	}
	d := rt.Pick(f, cands, s)
	d.Precise = precise
	if d.Index < 0 {
		return d, nil
	}
	prefill := d.Prefill
	if rt.opt.Marginal {
		base := -1
		for i := range cands {
			if cands[i].Usable && (base < 0 || s.Overlap[i] < base) {
				base = s.Overlap[i]
			}
		}
		s.marg = append(s.marg[:0], cands...)
		for i := range s.marg {
			s.marg[i].Precise = true
			s.marg[i].Overlap = s.Overlap[i] - base
		}
		d = rt.Pick(f, s.marg, s)
		d.Precise = precise
		prefill = max(0, d.Prefill-base)
	}
	if rt.opt.ColdAway > 0 && d.Overlap > 0 && soleHolder(cands, s, d.Index) {
		rt.noteWarm(d.Slot, rt.clockMS())
	}
	resident := int64(f.PromptTokens(rt.cfg))
	if res == nil {
		res = new(Reservation)
	}
	rt.reserveChain(res, d.Slot, prefill, resident, f.Blocks)
	predicted := 0
	if !precise || !cands[d.Index].Precise {
		predicted = min(d.Overlap/rt.cfg.BlockTokens, len(f.Blocks))
	}
	held := -1 // the chosen replica's depth in Pick's read of the index (a hint for the learn)
	if !cands[d.Index].Precise {
		held = int(s.depth[d.Slot])
	}
	rt.idx.learnOrQueue(f.Blocks, d.Slot, predicted, held, &res.learned)
	res.predicted, res.prompt, res.precise = int32(predicted), int32(resident), precise && cands[d.Index].Precise
	if n := len(f.Blocks); n > 0 {
		res.last, res.nblocks = f.Blocks[n-1], int32(n)
	}
	if predicted > 0 {
		res.held = f.Blocks[predicted-1]
	}
	res.agent = rt.agentKey(f, cands, s)
	if precise {
		a.Decided(f, cands, d, s)
	}
	return d, res
}
