package selection

import (
	"math"
	"sync/atomic"
)

// The prompt's density: bytes of prompt per real token, learned from the
// engines' answers.
//
// The index fingerprints prompt bytes and counts estimated tokens (bytes /
// Config.CharsPerToken); an engine counts real tokens, and real content is
// not CharsPerToken bytes per token (code, JSON and tool output run 2.5-3.5
// bytes per token with Qwen3's tokenizer, prose 4.2-5, and what the prompt
// carries that the engine renders otherwise, an image's base64, more). A
// replica's KV capacity, which an engine reports in real tokens, bounds
// what the index believes it holds in estimated tokens.
//
// Every answer's usage.prompt_tokens against the reservation's estimated
// tokens (Observe) feeds a ratio of sums with an exponential decay per
// real token (densityHalfLife), from a prior of CharsPerToken worth
// densityPrior tokens. Where prompts are lighter than CharsPerToken (more
// bytes per token), the index in estimated tokens would believe a replica
// holds less than it does and forget prefixes the engine still serves,
// which no answer can undo (an answer showing more cached than predicted
// restores nothing the index dropped): the capacities (and the engines'
// other token figures, RealTokens) are then applied in estimated tokens at
// the learned ratio, re-applied when it moves by more than densityStep.
// Where prompts are denser, the index believes more than the engine holds;
// the answers' shortfalls correct that (Observe's horizon), and applying
// the density there measured worse (fleet simulation, 200-row windows of
// the tool-agent traces at 2.5 bytes per token: cached share -0.047 over
// 12 of 12 traces; bench/RESULTS.md "The learned density, applied only
// upwards"), so the scale never goes below 1. What that loss is made of
// (bench/EXPERIMENTS.md 105): not the index's belief but the load terms'
// capacity (the overflow term, softer at a capacity in larger units), and
// the rule with every constant in real tokens too (request_cost and the
// pair floor weigh 1.6x and 0.625x at 2.5) still lost those windows. At CharsPerToken bytes per
// token or more densely nothing changes. Options.FixedDensity keeps
// CharsPerToken's ratio always.
const (
	// densityPrior is the prior's weight in real tokens: the first
	// answers move the ratio only as far as their size warrants.
	densityPrior = 16384
	// densityHalfLife is the real tokens over which an answer's weight
	// halves: the ratio follows a change of the traffic within about
	// that much of it.
	densityHalfLife = 1 << 20
	// densityStep is the relative move of the learned scale past which
	// the capacities are applied again (a lock and a pass over the slots).
	densityStep = 1.0 / 32
	// densityMin and densityMax bound one answer's bytes per token (a
	// prompt_tokens of 1 for a long prompt says nothing about density).
	densityMin, densityMax = 0.5, 64
)

// densitySums packs the decayed sums of estimated tokens (as bytes /
// CharsPerToken, so the ratio is a scale) and real tokens as two float32s
// in one word, updated by compare-and-swap: one atomic operation per
// answer, no lock.
type densitySums struct {
	w atomic.Uint64
	// scale: math.Float64bits of the scale last applied to the
	// capacities (0: none, i.e. 1).
	scale atomic.Uint64
}

func packSums(est, real float32) uint64 {
	return uint64(math.Float32bits(est))<<32 | uint64(math.Float32bits(real))
}

func unpackSums(w uint64) (est, real float32) {
	if w == 0 {
		return densityPrior, densityPrior
	}
	return math.Float32frombits(uint32(w >> 32)), math.Float32frombits(uint32(w))
}

// noteDensity adds one answer: est estimated tokens (the reservation's)
// that the engine counted as real tokens. It reports whether the learned
// scale moved past densityStep from the one applied.
func (rt *Router) noteDensity(est, real int) bool {
	if est <= 0 || real <= 0 {
		return false
	}
	cpt := rt.cfg.CharsPerToken
	r := float64(est) / float64(real) // estimated tokens per real token
	r = min(max(r, densityMin/cpt), densityMax/cpt)
	decay := float32(math.Exp2(-float64(real) / densityHalfLife))
	d := &rt.dens
	for {
		old := d.w.Load()
		e, t := unpackSums(old)
		e, t = e*decay+float32(r*float64(real)), t*decay+float32(real)
		if d.w.CompareAndSwap(old, packSums(e, t)) {
			s, a := applicable(e, t), rt.densityScale()
			return s > a*(1+densityStep) || s < a*(1-densityStep)
		}
	}
}

// applicable is the scale the sums e and t call for: their ratio, never
// below 1 (see above).
func applicable(e, t float32) float64 { return max(1, float64(e)/float64(t)) }

// densityScale is the scale applied to the capacities: estimated tokens
// per real token (1 until the learned one moved past densityStep, and
// never below 1).
func (rt *Router) densityScale() float64 {
	if b := rt.dens.scale.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// reapplyDensity takes the applicable scale as the applied one and hands
// every registered slot's capacity to the index again.
func (rt *Router) reapplyDensity() {
	s := applicable(unpackSums(rt.dens.w.Load()))
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.dens.scale.Store(math.Float64bits(s))
	for sl := range Slot(rt.n.Load()) {
		if rt.keys[sl] != "" {
			rt.applyCapacity(sl)
		}
	}
}

// Density is the prompts' bytes per real token as the answers show it
// (Config.CharsPerToken's before any; with Options.FixedDensity never
// learned). The engines' figures are applied at it where it is above
// CharsPerToken (see above).
func (rt *Router) Density() float64 {
	e, t := unpackSums(rt.dens.w.Load())
	return rt.cfg.CharsPerToken * float64(e) / float64(t)
}

// RealTokens converts real tokens (an engine's count) to the index's
// estimated tokens at the applied density.
func (rt *Router) RealTokens(real int64) int64 {
	s := rt.densityScale()
	if s == 1 {
		return real
	}
	return int64(float64(real)*s + 0.5)
}
