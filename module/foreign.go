package module

import (
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// The other instances' prefill estimate (foreign_prefill,
// selection.ForeignPrefill) in the module: the precise path's feeds hand
// it every stored block run (kvindex.Precise.OnStored), decide refreshes
// it before each Route and credits the reservation Route made, and the
// first body byte of a response records this instance's first token. The
// fleet simulation's "fp" variant drives the same calls
// (bench/fleetsim/precise.go).

// setForeign turns the estimate on over rt, or off (on false): the
// policy provisioned last decides, as it does for the preflight.
func (k *kvState) setForeign(on bool, rt *selection.Router) {
	if !on {
		k.p.OnStored(nil)
		k.foreign.Store(nil)
		k.fp.Detach()
		return
	}
	k.fp.SetRouter(rt)
	k.p.OnStored(k.fp.StoredRun)
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

// foreignFirstToken records the request's first token on its replica in
// the estimate of the fleet's precise path, if it is on. A first attempt
// also teaches it the engines' prefill speed (the estimate's decay): its
// reservation's prefill tokens against the time since the request came
// in (body read and preflight included: milliseconds against the
// prefill's hundreds of them, and the estimate keeps a low quantile).
func (st *reqState) foreignFirstToken() {
	if st.fleet == nil || st.fallback || st.slot < 0 {
		return
	}
	pf := st.fleet.kv.Load()
	if pf == nil {
		return
	}
	fp := pf.kv.foreign.Load()
	if fp == nil {
		return
	}
	now := time.Now()
	if res, o := st.hold.Current(), st.metrics; res != nil && o != nil && o.st == st && st.attempts == 1 {
		fp.FirstTokenAfter(st.slot, now, res.Prefill(), now.Sub(o.start))
		return
	}
	fp.FirstToken(st.slot, now)
}
