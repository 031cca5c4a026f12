package module

import (
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// The other instances' prefill estimate (foreign_prefill,
// selection.ForeignPrefill) in the module: the precise path's feeds hand
// it every stored block run (kvindex.Precise.OnStored), decide refreshes
// it before each Route and credits the reservation Route made, the first
// body byte of a response records this instance's first token and the
// response's end its life. The fleet simulation's "fp" variant drives the
// same calls (bench/fleetsim/precise.go).

// setForeign turns the estimate on over rt with the others' unseen load
// at prior (selection.ForeignPrefill.SetPrior), or off (on false): the
// policy provisioned last decides, as it does for the preflight.
func (k *kvState) setForeign(on bool, rt *selection.Router, prior float64) {
	if k.fp.SetPrior(prior); !on {
		k.p.SetForeign(nil)
		k.foreign.Store(nil)
		k.fp.Detach()
		return
	}
	k.fp.SetRouter(rt)
	k.p.SetForeign(k.fp)
	k.foreign.Store(k.fp)
}

// foreignFor is the estimate a decision of this policy feeds, nil when
// foreign_prefill is off or there is no precise path.
func (s *RamjetSelection) foreignFor() *selection.ForeignPrefill {
	if s.kv == nil {
		return nil
	}
	return s.kv.foreign.Load()
}

// foreignEvent records in the estimate of the fleet's precise path, if
// it is on, the request's first token on its replica (end false) or the
// end of its response (end true, after a first token). A first attempt
// also teaches it the engines' prefill speed (the estimate's decay): its
// reservation's prefill tokens against the time since the request came
// in (body read and preflight included: milliseconds against the
// prefill's hundreds of them, and the estimate keeps a low quantile); and
// at its end a request's life (the others' contexts' decay).
func (st *reqState) foreignEvent(end bool) {
	var fp *selection.ForeignPrefill
	if pf := st.fleet; pf != nil && !st.fallback && st.slot >= 0 && pf.kv.Load() != nil {
		fp = pf.kv.Load().kv.foreign.Load()
	}
	if fp == nil {
		return // off: no clock read on the request path
	}
	o, now := st.metrics, time.Now()
	first := o != nil && o.st == st && st.attempts == 1
	switch res := st.hold.Current(); {
	case first && end:
		fp.Lived(now.Sub(o.start))
	case first && res != nil:
		fp.FirstTokenAfter(st.slot, now, res.Prefill(), now.Sub(o.start))
	case !end:
		fp.FirstToken(st.slot, now)
	}
}
