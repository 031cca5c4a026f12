package selection

import "sync/atomic"

// DefaultAgreeBand is the agreement band's width in tokens of score
// (Options.AgreeBand) once this instance has seen that other instances
// route to its replicas.
const DefaultAgreeBand = 16384

// AgreeMemory is how many answers the agreement band stays on after the
// last one that showed another instance's placement.
const AgreeMemory = 1024

// DefaultAgreeMax is the longest prompt (tokens) the agreement band
// applies to.
const DefaultAgreeMax = 16384

// agreement is what the answers tell about other ramjet instances routing
// to the same replicas (no KV events: each instance's approximate index
// learns only the prompts it routed itself).
type agreement struct {
	answers atomic.Int64 // answers observed
	foreign atomic.Int64 // answers counted at the last foreign one; 0: none
	// The prompts' own keys (agentKey) this instance has had answered,
	// direct-mapped: a conversation or agent it routed before.
	seen [agentMemory]atomic.Uint64
}

// agentMemory is how many conversations' and agents' keys an instance
// remembers.
const agentMemory = 4096

// observe counts one answer of a prompt of promptBlocks blocks for which
// the index predicted want blocks cached and the engine reported got;
// agent is the prompt's agentKey. The
// engine holding at least two blocks and a quarter of the prompt more than
// this instance ever sent the replica (a group's prefix, a conversation's
// earlier turns) is another instance's placement: one instance alone sees
// such a surplus only from the replies the engine keeps after a prompt
// (an agent's last output, a few hundred tokens) or from beliefs its
// horizon dropped. The latter happens to a lone instance on a saturated
// fleet or a small cache (agent-fleet at scale 1: 17 of 958 answers; the
// conversation trace at 65,536 tokens of KV: 13-22 a run), so a surplus
// counts only if this instance never had that conversation's or agent's
// prompts answered.
func (a *agreement) observe(got, want, promptBlocks int64, agent uint64) {
	n := a.answers.Add(1)
	known := false
	if agent != 0 {
		e := &a.seen[agent%agentMemory]
		known = e.Load() == agent
		e.Store(agent)
	}
	if got-want >= max(2, promptBlocks/4) && !known {
		a.foreign.Store(n)
	}
}

// agentKey is the key by which the agreement remembers a prompt's
// conversation or agent, once Pick has filled s.Overlap: its first block
// past what two replicas hold in this instance's view (a fleet-wide
// prefix), the conversation's or agent's own first block; 0 when the
// agreement is off (AgreeMax <= 0) or the prompt has no full block.
func (rt *Router) agentKey(f *Features, cands []Candidate, s *Scratch) uint64 {
	if lim := rt.agreeMax(); lim <= 0 || len(f.Blocks) == 0 {
		return 0
	}
	return f.Blocks[min(max(s.top2, 0)/rt.cfg.BlockTokens, len(f.Blocks)-1)]
}

// agentTie returns the block Pick's rendezvous tie-break hashes for a
// prompt longer than AgreeMax over at least SubsetGuardReplicas usable
// replicas (ok false: tieKey's): its agentKey, the agent's own first
// block, rather than the first block not every replica holds (the
// fleet-wide prefix's, the same for every agent). An agent's first turn
// then goes to the first idle replica in its own rendezvous order, where
// another instance that never saw the agent sends its next turn if that
// replica is idle in its view too, and where the home band sends it once
// the answers show other instances; with the fleet-wide prefix's order
// every instance filled the same replicas in the same order with
// different agents. A lone instance still spreads its agents over idle
// replicas (the same outcome, other replicas). On 8 replicas, every
// replica busy, it moved agent-fleet's multi-instance figures both ways
// (bench/EXPERIMENTS.md, mdef12), so smaller fleets keep tieKey's block.
func (rt *Router) agentTie(f *Features, cands []Candidate, s *Scratch) (uint64, bool) {
	if rt.opt.NoAgentTie || f.PromptTokens(rt.cfg) <= rt.agreeMax() {
		return 0, false
	}
	usable := 0
	for i := range cands {
		if cands[i].Usable {
			usable++
		}
	}
	if usable < SubsetGuardReplicas {
		return 0, false
	}
	key := rt.agentKey(f, cands, s)
	return key, key != 0
}

// remember notes that this instance had agent's prompt answered on a
// precise decision (Observe does not compare those): the agent is one it
// routed, so a later surplus of its context on an estimate's decision is
// not another instance's placement. Without it a lone precise instance
// read itself as several on the tool-agent trace 10 (its estimate-routed
// turns of agents whose earlier turns were precise; bench/EXPERIMENTS.md,
// section 115).
func (a *agreement) remember(agent uint64) {
	if agent != 0 {
		a.seen[agent%agentMemory].Store(agent)
	}
}

// on reports whether an answer among the last AgreeMemory showed another
// instance's placement.
func (a *agreement) on() bool {
	f := a.foreign.Load()
	return f > 0 && a.answers.Load()-f < AgreeMemory
}

// Several reports whether this instance has recently seen, in the
// engines' answers, prompts placed by other instances (the agreement band
// is on).
func (rt *Router) Several() bool { return rt.agreement.on() }

// agreePick applies the agreement band to Pick's winner w (best: the best
// score; first: the rendezvous tie key): the band for prompts up to
// AgreeMax, the home band for longer ones, while answers show other
// instances. Pick's tie key is read into *first unless *keyed.
func (rt *Router) agreePick(f *Features, cands []Candidate, s *Scratch, w int, best float64, prompt int, first *uint64, keyed *bool) int {
	if band := rt.agreeBand(prompt); band > 0 {
		if !*keyed {
			*first, *keyed = rt.tieKey(f, cands, s), true
		}
		return rt.agree(cands, s, w, best, band, *first, false)
	}
	if lim := rt.agreeMax(); rt.opt.AgreeHome < 0 || lim <= 0 || prompt <= lim || !rt.agreeOn() {
		return w
	}
	// A long prompt (an agent's context) of which no replica holds more
	// than another in this instance's view: this instance has not seen
	// the context beyond what several replicas hold (a fleet-wide
	// prefix), so another instance may have placed it. Every instance
	// hashes the same block, the first one past that prefix (the agent's
	// own first block), so all of them place such a prompt, and its first
	// turn, on the same replica. The same where this instance knows the
	// context on one replica but less than AgreeStale of the prompt past
	// that prefix: other instances routed the agent's turns since, and
	// most likely where the band sends it (following the stale home moved
	// agents back and forth between an instance's own load override and
	// the band's replica).
	top1, top2 := s.top1, s.top2
	stale := rt.opt.AgreeStale
	if stale == 0 {
		stale = DefaultAgreeStale
	}
	if len(f.Blocks) == 0 || top1 > top2 && float64(top1-top2) >= stale*float64(prompt-top2) || rt.opt.HomeWarm && top1 <= 0 {
		return w
	}
	band := rt.opt.AgreeHome
	if band == 0 {
		band = DefaultAgreeHome
	}
	key := f.Blocks[min(max(top2, 0)/rt.cfg.BlockTokens, len(f.Blocks)-1)]
	return rt.agree(cands, s, w, best, band*float64(prompt), key, true)
}

// DefaultAgreeHome is the home band's width in tokens of score per token
// of the prompt (Options.AgreeHome): wide enough to cover the pair term's
// differences between replicas (pair_weight x prompt x a share of the
// replica's KV), which this instance sees only for its own requests.
const DefaultAgreeHome = 4

// DefaultAgreeStale is Options.AgreeStale's default.
const DefaultAgreeStale = 0.25

// agreeMax is Options.AgreeMax with its default applied (negative: no
// limit).
func (rt *Router) agreeMax() int { return rt.pk.agreeMax }

// agreeBand is the agreement band Pick applies now: Options.AgreeBand
// (DefaultAgreeBand when 0; negative: none) while answers show other
// instances, or always with Options.AgreeAlways.
func (rt *Router) agreeBand(prompt int) float64 {
	b, lim := rt.opt.AgreeBand, rt.agreeMax()
	switch {
	case b < 0, lim > 0 && prompt > lim:
		return 0
	case b == 0:
		b = DefaultAgreeBand
	}
	if rt.agreeOn() {
		return b
	}
	return 0
}

// agreeOn reports whether the agreement applies: answers showed other
// instances' placements, or (Options.AgreeExt) the engines reported
// requests this instance did not reserve (SetExternalLoad); always with
// Options.AgreeAlways.
func (rt *Router) agreeOn() bool {
	return rt.opt.AgreeAlways || rt.agreement.on() || rt.opt.AgreeExt && rt.engOthers.Load()
}

// agree is the agreement band: among the usable candidates scoring within
// band of the best, the one with the highest rendezvous weight for the tie
// key first wins. Every instance computes the same weights, so instances
// whose views of the fleet differ (each knows only the prompts it routed
// and the load it reserved) still send a prompt whose known prefix ends at
// the same place to the same replica, as long as that replica scores
// within band of the best in each one's view: a group's first request and
// its later users, a conversation's turns dealt to different instances.
// A replica still prefilling this instance's own requests is not a band
// target (only the rule's own pick may be one) unless home (the home
// band: an agent's turns are sequential, so what prefills there is
// another agent's, and leaving its home costs the agent's whole context:
// tuning seeds, agent-fleet x4 at 8 TTFT p50 1.10x -> 1.08x, p99 1.09x ->
// 0.93x one instance's), and a decision with an exact overlap (the
// precise path, which sees every instance's placements) is left as it
// is. Past three such replicas (a burst) the rule's pick stands: walking on,
// 4 instances each sent a 96-request burst over 64 replicas onto the same
// 24 (TTFT p50 1.23x one instance's; 1.00x with the rule's spill).
func (rt *Router) agree(cands []Candidate, s *Scratch, w int, best, band float64, first uint64, home bool) int {
	top := rt.Rendezvous(first, cands[w].Slot)
	// busy: the three highest weights among the replicas left out for
	// prefilling this instance's own requests.
	k, busy := w, [3]uint64{}
	for i := range cands {
		c := &cands[i]
		if !c.Usable {
			continue
		}
		if c.Precise {
			return w
		}
		if s.Score[i] < best-band {
			continue
		}
		r := rt.Rendezvous(first, c.Slot)
		if _, pending := rt.Load(c.Slot); pending > 0 && i != w && !home {
			// Still computing prompts this instance sent: load it knows
			// is real and imminent, which a burst of one prefix would
			// pile onto the replica every instance agrees on.
			for j := range busy {
				if r > busy[j] {
					r, busy[j] = busy[j], r
				}
			}
			continue
		}
		if r > top {
			k, top = i, r
		}
	}
	if busy[2] > top && !rt.opt.AgreeWalk {
		// Three replicas the band ranks above its choice are prefilling
		// this instance's own requests: a burst of one prefix. Every instance
		// walking on down the same order would pile its burst N deep
		// onto the same replicas; the rule's pick (and its instance
		// spill) spreads it.
		return w
	}
	return k
}
