package fleetstate

import (
	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/selection"
)

// NewIntegrityReport is the report of a replica's integrity status.
func NewIntegrityReport(st integrity.Status) *IntegrityReport {
	return &IntegrityReport{Out: st.Out, Reason: string(st.Reason), Attested: st.Attested,
		Quarantined: st.Quarantined, Durable: st.Durable, Observed: st.Observed, Streak: st.Streak, Ratio: st.Ratio}
}

// NewExplainSession is the session shadow's side of an explanation: the
// request's session key (hashed, never kept), the fleet's shadow, the
// opaque id of a slot and the id the decision named.
func NewExplainSession(ss *integrity.SessionShadow, session string, slotID func(selection.Slot) string, decided string) *ExplainSession {
	es := &ExplainSession{Counts: map[string]uint64{}}
	c := ss.Counts()
	for _, o := range integrity.ShadowOutcomes {
		es.Counts[o.String()] = c[o]
	}
	slot, known := ss.Sticky(xxhash.Sum64String(session))
	es.Known = known
	if known {
		es.StickyUpstream = slotID(selection.Slot(slot))
	}
	es.Agree = !known || es.StickyUpstream == decided
	return es
}
