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
// what the index believes it holds in estimated tokens: at 2.5 bytes per
// token against the default 4, a replica of 65,536 real tokens was
// believed to hold 1.6 times what it does.
//
// Every answer's usage.prompt_tokens against the reservation's estimated
// tokens (Observe) feeds a ratio of sums with an exponential decay per
// real token (densityHalfLife), from a prior of CharsPerToken worth
// densityPrior tokens. Capacities are applied in estimated tokens at the
// learned ratio, re-applied when it moves by more than densityStep; until
// then (and at exactly CharsPerToken bytes per token, forever) nothing
// changes. Options.FixedDensity keeps CharsPerToken's ratio.
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
			s := float64(e) / float64(t)
			a := rt.densityScale()
			return s > a*(1+densityStep) || s < a*(1-densityStep)
		}
	}
}

// densityScale is the scale applied to the capacities: estimated tokens
// per real token (1 until the learned one moved past densityStep).
func (rt *Router) densityScale() float64 {
	if b := rt.dens.scale.Load(); b != 0 {
		return math.Float64frombits(b)
	}
	return 1
}

// reapplyDensity takes the learned scale as the applied one and hands
// every registered slot's capacity to the index again.
func (rt *Router) reapplyDensity() {
	e, t := unpackSums(rt.dens.w.Load())
	s := float64(e) / float64(t)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.dens.scale.Store(math.Float64bits(s))
	for sl := range Slot(rt.n.Load()) {
		if rt.keys[sl] != "" {
			rt.applyCapacity(sl)
		}
	}
}

// Density is the prompts' bytes per real token as the router applies it to
// the engines' figures: Config.CharsPerToken until the answers moved it
// (and always with Options.FixedDensity).
func (rt *Router) Density() float64 { return rt.cfg.CharsPerToken * rt.densityScale() }

// RealTokens converts real tokens (an engine's count) to the index's
// estimated tokens at the applied density.
func (rt *Router) RealTokens(real int64) int64 {
	s := rt.densityScale()
	if s == 1 {
		return real
	}
	return int64(float64(real)*s + 0.5)
}
