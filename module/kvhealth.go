package module

import (
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/kvindex"
)

// kvFeeds returns the feed health of every replica key of f's precise
// path, or nil when it is off.
func kvFeeds(f *fleet) map[string]*fleetstate.KVFeedHealth {
	if f == nil {
		return nil
	}
	pf := f.kv.Load()
	if pf == nil {
		return nil
	}
	stats := pf.kv.x.AppendReplicaStats(nil)
	out := make(map[string]*fleetstate.KVFeedHealth, len(stats))
	for _, st := range stats {
		out[st.ID] = feedHealth(st)
	}
	return out
}

func feedHealth(st kvindex.ReplicaStats) *fleetstate.KVFeedHealth {
	h := &fleetstate.KVFeedHealth{Healthy: st.Healthy && st.Fresh}
	switch {
	case !st.Healthy:
		h.Reason = "stores_not_landing: " + st.Unhealthy
	case !st.Fresh:
		h.Reason = "not_fresh"
	}
	return h
}
