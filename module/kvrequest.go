package module

import (
	"net/http"

	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/selection"
)

// kvRequest ties one request's precise-path predictions to its life: a
// precise decision's predictions (Route's Decided) and a late preflight's
// (kvindex.Late) are held until the engine's events confirm them or the
// request ends, not for a fixed time. It is the request's observer, created
// by the preflight (kvPreflight.preflight) and ended with the request.
type kvRequest struct {
	p    *kvindex.Precise
	st   *reqState
	late *kvindex.Late // the preflight missed its timeout or was deferred; nil otherwise
	body bool          // the response's first body byte was written
}

// routedSlot is the request's current decision, once Select made it (a
// late preflight's answer asks, from the tokenizer's goroutine).
func (st *reqState) routedSlot() (selection.Slot, bool) {
	if res := st.hold.Current(); res != nil {
		return res.Slot(), true
	}
	return -1, false
}

// WriteHeader tells a late preflight where the request went (if its answer
// did not come before Select finished).
func (k *kvRequest) WriteHeader(int, http.Header) {
	if k.late != nil && k.st.slot >= 0 {
		k.late.Routed(k.st.slot)
	}
}

// Write sends, at the response's first body byte (the first token of a
// stream), a preflight deferred until the prompt was computed.
func (k *kvRequest) Write(p []byte) {
	if k.late != nil && !k.body && len(p) > 0 {
		k.body = true
		k.late.FirstByte()
	}
}

// End releases the request's predictions: those left unconfirmed live the
// grace more.
func (k *kvRequest) End(int, error) {
	if k.late != nil {
		k.late.End()
	}
	k.releaseAttempt()
}

// retried releases the predictions of the attempt a retry replaces (Select
// calls it before picking again), so that the earlier replica's blocks live
// only the grace more instead of until the PredictTTL bound, whether a
// precise decision or a late preflight's tokens made them; a late
// preflight then predicts for the retry's replica.
func (st *reqState) retried() {
	k := st.route.kv
	if k == nil {
		return
	}
	if k.late != nil {
		k.late.Retried()
	}
	k.releaseAttempt()
	st.decision.Precise = false // released: the next decision replaces it
}

// releaseAttempt ends the holds of the current attempt's precise decision
// (a decision that picked no replica, Index < 0, held nothing).
func (k *kvRequest) releaseAttempt() {
	if k.st.decision.Precise && k.st.decision.Index >= 0 && k.st.slot >= 0 {
		k.p.Ended(k.st.slot, k.st.route.tokens)
	}
}
