package selection

// Observe feeds the engine's answer back into the approximate index: the
// engine's own count of the request's prompt tokens (promptTokens, 0 when
// unknown), of those it served from its prefix cache (cachedTokens,
// usage.prompt_tokens_details.cached_tokens of an OpenAI-compatible
// response, or the first chunk's; negative when not known yet) and of
// the tokens it generated (completionTokens, 0 when not known yet). res
// is the request's reservation from Route, before or after its Release;
// each of the two counts is taken once, in one call or two (the fleet
// simulation passes the cached count at the first token, the completion
// at the end). It reports whether the cached count changed what the index
// believes.
//
// With Options.ReplyCharge (off by default, see there), the completion is
// charged to the replica (Index.Replied): the engine caches the reply's
// blocks beside the prompt's (vLLM caches a sequence's full generated
// blocks; SGLang's cache_finished_req inserts its input and output ids),
// so they take room the index's model of its cache must count, or the
// index believes prompts held that the engine evicted to make that room
// (bench/EXPERIMENTS.md, sections 24 (23c) and 28). When a later prompt
// extends this one on the replica and the engine reports more cached than
// the index predicted, the engine reused the reply (the next turn renders
// it as generated) and its charge goes: that prompt's own blocks count it.
// Where replies are not rendered back as generated (reasoning stripped,
// a trace's synthetic turns), the charge stays until it ages out, as the
// engine's blocks do.
//
// Route recorded what the index predicted the replica held of the prompt
// and how long ago (in blocks sent to the replica since) the deepest of
// it was sent. The engine's count corrects the index where nothing else
// tells ramjet about evictions (no KV events, no engine integration):
//
//   - Fewer cached tokens than predicted: the engine had evicted the
//     prompt from the first uncached block on, although ramjet had sent it
//     only that many blocks ago. That age is an upper bound on how long the
//     replica keeps what ramjet sends it (its KV cache is shared with the
//     running requests' context, with outputs, with other routers'
//     traffic), so it becomes the replica's horizon: beliefs older than
//     that are dropped, now and from then on (Index.SetHorizon). The
//     prompt itself stays believed: the engine has just computed and cached
//     it again.
//   - More cached tokens than predicted: the engine kept what the index
//     had dropped, so the index trusts it. The prompt is already believed
//     (Route learned it); the replica's horizon, if any, is doubled so that
//     it drops less from then on.
//
// A shortfall is ignored (unless Options.ObserveShadowed) when the prompt
// shared a prefix with a request still prefilling on the replica when it
// was routed: the engine had not computed that prefix yet, which says
// nothing about evictions (read as one, it collapsed the horizon to a few
// hundred blocks on an overloaded replica and the index forgot the
// replica's agents: bench/EXPERIMENTS.md, section 16).
//
// promptTokens, the first time a reservation is given one, also feeds the
// prompts' learned density (density.go), precise decisions included: where
// prompts are lighter than CharsPerToken, the engines' KV capacities meet
// the index's estimated tokens at it.
//
// Counts within one block of the prediction confirm it. promptTokens
// scales cachedTokens to the index's estimated tokens (the index counts
// tokens estimated from bytes, the engine real ones).
func (rt *Router) Observe(res *Reservation, promptTokens, cachedTokens, completionTokens int) bool {
	if res == nil || res.rt == nil {
		return false
	}
	s := res.slot
	if c := &rt.loads[s]; c.gen() != res.gen {
		return false // the replica left since
	}
	if completionTokens > 0 && res.nblocks > 0 && rt.opt.ReplyCharge && res.replied.CompareAndSwap(false, true) {
		// What the engine caches past the fingerprinted prompt: the
		// reply, and the prompt's partial last block (in the index's
		// estimated tokens, as cachedTokens below).
		reply := res.estimated(completionTokens, promptTokens)
		rt.idx.Replied(res.last, s, int((int64(res.prompt)+reply)/int64(rt.cfg.BlockTokens))-int(res.nblocks))
	}
	if promptTokens > 0 && !rt.opt.FixedDensity && res.densed.CompareAndSwap(false, true) && rt.noteDensity(int(res.prompt), promptTokens) {
		rt.reapplyDensity()
	}
	if res.precise && cachedTokens >= 0 {
		rt.agreement.remember(res.agent)
	}
	if res.precise || cachedTokens < 0 || !res.observed.CompareAndSwap(false, true) {
		return false
	}
	got := res.estimated(cachedTokens, promptTokens) / int64(rt.cfg.BlockTokens)
	want := int64(res.predicted)
	rt.agreement.observe(got, want, int64(res.prompt)/int64(rt.cfg.BlockTokens), res.agent)
	switch {
	case got+1 < want && res.shadowed && !rt.opt.ObserveShadowed:
		// A request sharing the prompt was still prefilling on the
		// replica: what the engine had not computed yet was not evicted.
		return false
	case got+1 < want:
		// The deepest predicted block was learned blocks old when Route
		// learned the prompt; block got, the first one evicted, was sent
		// want-1-got blocks after it.
		learned := rt.idx.settled(&res.learned)
		if learned < 0 {
			break
		}
		age := max(1, learned-(want-1-got))
		floor := int64(rt.opt.HorizonFloor * float64(rt.idx.Capacity(s)))
		switch {
		case rt.opt.InflightGuard:
			if c, n, ok := rt.oldestInflight(s); ok {
				g := rt.idx.clockOf(s) - c + int64(n) + 1
				if k, c := rt.opt.GuardCap, rt.idx.Capacity(s); k > 0 && c > 0 && float64(g) > k*float64(c) {
					g = 0 // more than the replica holds: the shortfall's age stands
				}
				if floor > 0 {
					g = min(g, floor)
				}
				age = max(age, g)
			}
		case floor > 0:
			age = max(age, floor)
		}
		if h := rt.idx.Horizon(s); h == 0 || age < h {
			rt.idx.SetHorizon(s, age)
			return true
		}
	case got > want+1:
		if res.held != 0 && rt.opt.ReplyCharge {
			// The engine held more than the prompt the index predicted:
			// it reused that prompt's cached reply, which this prompt's
			// blocks now cover.
			rt.idx.dropReply(res.held, s)
		}
		if h := rt.idx.Horizon(s); h > 0 {
			rt.idx.SetHorizon(s, 2*h)
			return true
		}
	}
	return false
}

// estimated scales n of the engine's tokens to the index's estimated
// tokens (the prompt's bytes over chars_per_token), by the engine's count
// of the prompt's tokens (promptTokens, 0 when unknown: n as it is).
func (res *Reservation) estimated(n, promptTokens int) int64 {
	if promptTokens > 0 && res.prompt > 0 {
		return int64(n) * int64(res.prompt) / int64(promptTokens)
	}
	return int64(n)
}

// oldestInflight is the index clock of slot s when the oldest request
// still in flight there was learned, and its blocks; ok false when none.
func (rt *Router) oldestInflight(s Slot) (clock int64, blocks int32, ok bool) {
	l := &rt.chains[s]
	l.mu.Lock()
	defer l.mu.Unlock()
	var last *Reservation
	for j := l.head; j != nil; j = j.next {
		if !j.learned.pending.Load() && j.learned.clock.Load() > 0 {
			last = j
		}
	}
	if last == nil {
		return 0, 0, false
	}
	return last.learned.clock.Load(), last.nblocks, true
}
