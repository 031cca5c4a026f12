package kvindex

import (
	"sync"
	"sync/atomic"
)

// The wait rule. A request whose prompt has no cached message prefix
// (prefix.go) waits for its /tokenize preflight, ahead of routing, so that
// its decision reads the exact overlaps. Under the estimate cap
// (SetEstimate) that decision differs from the estimate's only where a
// kept exact overlap differs from the estimate's credit: the engine evicted
// what the estimate believes, or holds blocks this router did not route
// (other instances, other clients; the prompt past the estimate's
// fingerprint bound). Every precise decision records whether that
// happened (diverged). While recent precise decisions had no such
// difference, waiting buys no other decision and costs every request the
// round trip (through HTTP 10 ms on a 200-row tool-agent window, all but
// one of its requests waiting: TTFT p50 +3-5% against the default path,
// bench/RESULTS.md, 2026-12-06, "the preflight's p50 cost"): such a
// request is routed by the estimate at once, its preflight sent in the
// background as a Late handle (its tokens predict the chosen replica's
// blocks and teach the message-prefix cache), and one in divergeSample
// still waits, so that the share keeps being measured. Without the
// estimate cap (no SetEstimate, ExactPastEstimate) every request waits, as
// before.
const (
	// divergeChecks is how many precise decisions must have been recorded
	// before requests stop waiting.
	divergeChecks = 16
	// divergeWeight is the weight of one decision in the recent share of
	// diverged decisions; above divergeWait requests wait again (one
	// diverged decision makes the next four wait at least).
	divergeWeight = 1.0 / 16
	divergeWait   = 0.05
	// divergeSample: while requests do not wait, every divergeSample-th
	// still does.
	divergeSample = 16
)

// divergence is the record of precise decisions whose kept exact overlaps
// differed from the estimate's (see the wait rule above).
type divergence struct {
	mu     sync.Mutex
	checks int
	share  float64
	calm   atomic.Bool // checks >= divergeChecks and share <= divergeWait

	seen, diverged, unwaited, n atomic.Uint64
}

// noteDiverged records one precise decision under the estimate cap.
func (p *Precise) noteDiverged(diverged bool) {
	d := &p.div
	d.seen.Add(1)
	v := 0.0
	if diverged {
		v = 1
		d.diverged.Add(1)
	}
	d.mu.Lock()
	d.checks++
	d.share += divergeWeight * (v - d.share)
	d.calm.Store(d.checks >= divergeChecks && d.share <= divergeWait)
	d.mu.Unlock()
}

// waitPreflight reports whether a request without a usable cached prefix
// waits for its preflight (the wait rule above).
func (p *Precise) waitPreflight() bool {
	if p.est.Load() == nil || p.cfg.ExactPastEstimate || !p.div.calm.Load() {
		return true
	}
	return p.div.n.Add(1)%divergeSample == 0
}

// DivergeStats counts the precise decisions recorded by the wait rule and
// those whose exact overlaps differed from the estimate's, and the
// requests routed by the estimate without waiting for their preflight
// because recent decisions had no such difference.
func (p *Precise) DivergeStats() (decisions, diverged, unwaited uint64) {
	d := &p.div
	return d.seen.Load(), d.diverged.Load(), d.unwaited.Load()
}
