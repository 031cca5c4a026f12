package selection

import "cmp"

// DefaultIndexShare and DefaultIndexShareRoom are Options.IndexShare's
// and IndexShareRoom's defaults; DefaultQueueExtra, DefaultQueueExtraRoom
// and DefaultQueueExtraFull are Options.QueueExtra's and its gates'. The
// index models 0.8 of a replica's KV capacity as its prefix cache where
// that capacity holds at least 24 of this router's mean prompts, and a
// request cold everywhere weighs a replica's pending prefill 3 times (2
// more) where the capacity holds 24 mean prompts and the index believes
// the cache at least half full. Chosen in the fleet simulation on
// shared-prefix at 8 replicas of 196,608 tokens (issue 12's cell B, seeds
// 1-12; held out 13-24: TTFT p99 1.101x -> 1.001x dynamo-tuned's), with
// every guard row unchanged but the README shared-prefix row's max/mean
// load (1.11 -> 1.09): bench/EXPERIMENTS.md sections 85 and 87.
const (
	DefaultIndexShare     = 0.8
	DefaultIndexShareRoom = 24.0
	DefaultQueueExtra     = 2.0
	DefaultQueueExtraRoom = 24.0
	DefaultQueueExtraFull = 0.5
)

// indexShare is Options.IndexShare with its default applied: the share of
// the capacity the index models, 0 when off (the whole).
func (rt *Router) indexShare() float64 {
	sh := cmp.Or(rt.opt.IndexShare, DefaultIndexShare)
	if sh <= 0 || sh >= 1 {
		return 0
	}
	return sh
}

// indexShareRoomOn reports whether IndexShare is on with its room gate
// (it reads the running mean prompt, notePrompt).
func (rt *Router) indexShareRoomOn() bool {
	return rt.opt.IndexShareRoom >= 0 && rt.indexShare() > 0
}

// queueExtra is Options.QueueExtra's weight for a request whose deepest
// usable overlap is top1, 0 when it does not apply: off, the request is
// warm somewhere (without QueueExtraWarm), the usable replicas' profiles
// differ for a request that wants one (profiles), no mean prompt is known
// yet under the room gate, or no KV capacity is known under the full gate
// (the index unbounded: never full). kv is the least KV capacity in tokens
// the room gate lets through (0: no gate). Every test is per request, so
// that without a known capacity the candidates' loop pays one compare.
func (rt *Router) queueExtra(top1 int, profiles bool) (qx, kv float64) {
	qx = cmp.Or(rt.opt.QueueExtra, DefaultQueueExtra)
	if qx <= 0 || profiles || top1 > 0 && !rt.opt.QueueExtraWarm {
		return 0, 0
	}
	if f := rt.opt.QueueExtraFull; f >= 0 && !rt.capKnown.Load() {
		return 0, 0
	}
	if k := cmp.Or(rt.opt.QueueExtraRoom, DefaultQueueExtraRoom); k > 0 {
		avg := float64(rt.promptAvg.Load()) / promptAvgScale
		if avg <= 0 {
			return 0, 0
		}
		kv = k * avg
	}
	return qx, kv
}

// queueExtraRoomOn reports whether QueueExtra is on with its room gate
// (it reads the running mean prompt, notePrompt).
func (rt *Router) queueExtraRoomOn() bool {
	return rt.opt.QueueExtraRoom >= 0 && rt.opt.QueueExtra >= 0
}

// queueExtraLoad is QueueExtra's charge on slot s at weight qx (queueExtra
// gave qx and kv): qx times s's pending prefill while its gates hold. The
// cheap tests come first: nothing pending, then the room gate (s's KV
// capacity at least kv: an atomic), then the full gate (the index's lock).
func (rt *Router) queueExtraLoad(s Slot, qx, kv float64) float64 {
	c := &rt.loads[s]
	p := c.pending.Load()
	if p == 0 || float64(c.kv()) < kv {
		return 0
	}
	if f := cmp.Or(rt.opt.QueueExtraFull, DefaultQueueExtraFull); f > 0 {
		capa := rt.idx.Capacity(s)
		if capa <= 0 || float64(rt.idx.Held(s)) < f*float64(capa) {
			return 0
		}
	}
	return qx * float64(p)
}
