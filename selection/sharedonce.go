package selection

// Counting what the engine holds: a prefix shared by requests in flight.
//
// The overflow term (Options.OverflowWeight) charges a replica for the
// context its in-flight requests keep resident past its KV capacity. The
// engine holds a block that several running requests reference once;
// reserveChain's rule finds a shared prefix only where one prompt
// extends another's (at its whole length or 15/16, 3/4 or 1/2 of it), so
// requests of different sessions that share a deep prefix (an agent
// framework's system prompt and tools, 8-23k tokens in the tool-agent
// trace) read as several copies of it, and a replica where they gather
// looks over its capacity when the engine is not. Options.SharedOnce
// counts, for the overflow term only, every block two in-flight prompts
// share once: each reservation keeps its prompt's blocks and a new prompt
// takes from each earlier one the depth they share (a bisection: blocks
// are chained), which the newer one then counts (chainList.kv).

// shareOnce is reserveChain's count under Options.SharedOnce: in-flight
// j on the replica no longer counts in l.kv the blocks it shares with the
// new prompt blocks (which counts them), beyond those it gave up already
// (l.mu held).
func (rt *Router) shareOnce(l *chainList, j *Reservation, blocks []uint64) {
	d := sharedDepth(blocks, j.blocks)
	if d <= j.shared || j.kv == 0 {
		return
	}
	sub := min(j.kv, int64(d-j.shared)*int64(rt.cfg.BlockTokens))
	j.kv -= sub
	l.kv.Add(-sub)
	j.shared = d
}

// sharedDepth is how many leading blocks a and b share. Blocks are
// chained (each hash covers its prefix), so the predicate "block k-1 is
// equal" holds for every k up to the depth and none past it: a bisection.
func sharedDepth(a, b []uint64) int32 {
	lo, hi := 0, min(len(a), len(b)) // a[:lo] shared; a[hi] not known
	for lo < hi {
		m := lo + (hi-lo+1)/2
		if a[m-1] == b[m-1] {
			lo = m
		} else {
			hi = m - 1
		}
	}
	return int32(lo)
}

// The gated form (Options.OnceBelow): SharedOnce's count where a
// replica's KV capacity is small against the contexts it holds, the rule's
// elsewhere. Where an agent's context is a large part of a replica's KV
// (the tool-agent trace at 65,536 tokens), the rule's count, which reads
// a deep prefix shared by in-flight agents once per request, spreads
// turns cold over a fleet whose caches cannot take them; where the KV
// holds many contexts (the engine model's default), reading that prefix
// several times spreads agents before a queue forms at their home, which
// SharedOnce alone gives up (bench/EXPERIMENTS.md section 71). The
// contexts are the prompts this router reserved, a running mean.

// promptAvgScale is promptAvg's fixed-point scale, promptAvgShift its
// mean's weight: each reservation moves it 1/2^promptAvgShift of the way.
const (
	promptAvgScale = 16
	promptAvgShift = 6
)

// notePrompt adds a reserved prompt of tokens to the running mean
// (a lost update under a race only delays it).
func (rt *Router) notePrompt(tokens int64) {
	a := rt.promptAvg.Load()
	if a == 0 {
		a = tokens * promptAvgScale // the first prompt starts the mean
	}
	rt.promptAvg.Store(a + (tokens*promptAvgScale-a)>>promptAvgShift)
}

// onceOn reports whether the gated form applies SharedOnce's count on a
// replica of capa tokens of KV.
func (rt *Router) onceOn(capa float64) bool {
	return rt.opt.OnceBelow > 0 && capa < rt.opt.OnceBelow*float64(rt.promptAvg.Load())/promptAvgScale
}
