package kvindex

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// The wait rule (tokenize_wait auto, the default; always opts out). A
// request whose prompt has no cached message prefix
// (prefix.go) is routed by the estimate at once, its preflight sent in the
// background as a Late handle (its tokens predict the chosen replica's
// blocks and teach the message-prefix cache), and one routed on a cached
// prefix is routed by the estimate too, without the lookup of the
// prefix's exact overlaps (its deferred preflight unchanged), unless the
// exact overlaps may tell otherwise: under the estimate cap (SetEstimate) a precise
// decision differs from the estimate's only where a kept exact overlap
// differs from the estimate's credit, that is where an engine dropped
// blocks the estimate still credits (evicted, or its cache cleared) or
// holds blocks this router did not route (other instances' placements),
// or under CapLoad (the default) or CapQueue holds blocks the estimate
// dropped on a replica whose load is under the gate (the rule does not
// wait for those alone: an engine that evicts nothing holds what the
// estimate's bound dropped only where the bound is below the engine's
// real capacity).
// So the request waits for its preflight while an engine dropped indexed
// blocks within the last RemovalWindow, or once the router has seen other
// instances (selection.Router.SawOthers), or without the estimate cap (no
// SetEstimate, ExactPastEstimate) or without WaitAuto (tokenize_wait
// always): every request waits, as before. A lone
// instance whose engines evict nothing pays no round trip and no exact
// lookup: through HTTP the preflight added 5-10 ms to every request of a
// 200-row tool-agent window, and agent-fleet's turns routed on a cached
// prefix paid the precise decision's lookup of a long context's engine
// blocks before routing (TTFT p50 +3-5% against the default path,
// bench/RESULTS.md, 2026-12-06, "the preflight's p50 cost").
//
// Other instances are seen without a waiting decision: the others'
// prefill estimate (selection.ForeignPrefill, foreign_prefill, on by
// default with kv) counts the stored runs of every feed beyond this
// instance's own reservations, routed at once or not, and its evidence
// (ForeignEvidenceShare, since ever or within selection.EvidenceWindow)
// sets SawOthers; so does another instance's load in the engines' metrics
// (engine_metrics). A request routed at once reserves the bytes' estimate
// of its prompt, and its Late handle's tokens credit the rest
// (SetForeign); one routed on its cached message prefix reserves the
// prefix's tokens and the other messages' bytes' estimate (Late.PromptTokens;
// its own tokens come only after its prefill), its estimated prefill
// scaled to them where they are fewer than the bytes' estimate
// (selection.ForeignPrefill.Reserved: TestLoneChatOwnRuns), so a lone
// instance's own runs do not read as foreign. In the fleet simulation 2 and
// 4 instances under the rule then wait from their first few decisions on
// and route as with always (tool-agent traces at 8 replicas, agent-fleet,
// shared-prefix: bench/RESULTS.md, 2026-12-07, "The wait rule with
// several instances"). The 9-35x TTFT p50 of 4 instances on the
// tool-agent trace that kept the rule opt-in (2026-12-06) was the
// simulation's: an instance whose first decision was routed at once never
// bound its slots to the feeds, so it counted no foreign run.
//
// Measured first as a sampled share of diverged decisions (one in 16
// requests waiting to keep measuring it): the fleet simulation's burst
// then lost its tail (a sampled precise decision saw the exact overlaps
// without the predictions of the requests routed at once, their tokens
// still on the way), bench/EXPERIMENTS.md 76.
const RemovalWindow = time.Minute

// divergence counts what the wait rule saw: precise decisions under the
// estimate cap, those whose kept exact overlaps differed from the
// estimate's credit (capByEstimate), and requests routed at once.
type divergence struct {
	seen, diverged, unwaited atomic.Uint64
}

// noteDiverged records one precise decision under the estimate cap.
func (p *Precise) noteDiverged(diverged bool) {
	p.div.seen.Add(1)
	if diverged {
		p.div.diverged.Add(1)
	}
}

// WaitPreflight reports whether a request without a usable cached prefix
// waits for its preflight (the wait rule above; PreflightBody asks it, and
// the fleet simulation's ramjet-precise, unless @always, for every decision).
func (p *Precise) WaitPreflight() bool {
	e := p.est.Load()
	if e == nil || !p.cfg.WaitAuto || p.cfg.ExactPastEstimate || e.rt.SawOthers() {
		return true
	}
	last := p.x.lastRemoval.Load()
	return last != 0 && p.x.cfg.Now().UnixNano()-last < int64(RemovalWindow)
}

// WaitFor is WaitPreflight for a request of features f, with WaitWarm: a
// lone instance (no other instances seen, under the estimate cap) routes
// at once a request whose prompt the estimate credits to no replica. Its
// exact overlaps are then capped by a credit of zero, wherever this router
// routed the blocks, so they cannot decide otherwise; on shared-prefix
// through HTTP a third of the waits were such cold prompts, each 20-35 ms
// of wall time for no prefill saved (bench/RESULTS.md, 2026-12-07,
// "Cell B's precise-path TTFT through HTTP, request by request").
func (p *Precise) WaitFor(f *selection.Features) bool {
	if !p.WaitPreflight() {
		return false
	}
	e := p.est.Load()
	if !p.cfg.WaitWarm || f == nil || len(f.Blocks) == 0 || e.rt.SawOthers() || p.cfg.ExactPastEstimate {
		return true
	}
	var all selection.SlotSet
	for i := range all {
		all[i] = ^uint64(0)
	}
	var depth [selection.MaxReplicas]int32
	e.x.DepthsWith(f.Blocks[:1], &all, &depth, selection.NewScratch(0))
	return slices.ContainsFunc(depth[:], func(d int32) bool { return d > 0 })
}

// DivergeStats counts the precise decisions under the estimate cap and
// those whose kept exact overlaps differed from the estimate's credit by
// more than one router block, and the requests routed by the estimate
// without waiting for their preflight (the wait rule).
func (p *Precise) DivergeStats() (decisions, diverged, unwaited uint64) {
	d := &p.div
	return d.seen.Load(), d.diverged.Load(), d.unwaited.Load()
}
