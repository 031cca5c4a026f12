package module

import "github.com/ramjet-llm/ramjet/kvindex"

// KVFeedHealth is a replica's KV-event feed in the /health answer (the
// precise path on). A replica whose feed is unhealthy stays usable: it is
// routed by the estimate until its stores land again.
type KVFeedHealth struct {
	// Healthy reports that the feed's stores land in the index and it is
	// fresh (its replica is routed by the exact overlap).
	Healthy bool `json:"healthy"`
	// Reason says why not: "stores_not_landing: <detail>" (e.g. every
	// store an orphan: the engine's parents or block size do not match
	// the index's), or "not_fresh" (no event yet, or fenced after a
	// sequence gap or reset).
	Reason string `json:"reason,omitempty"`
}

// kvFeeds returns the feed health of every replica key of f's precise
// path, or nil when it is off.
func kvFeeds(f *fleet) map[string]*KVFeedHealth {
	if f == nil {
		return nil
	}
	pf := f.kv.Load()
	if pf == nil {
		return nil
	}
	stats := pf.kv.x.AppendReplicaStats(nil)
	out := make(map[string]*KVFeedHealth, len(stats))
	for _, st := range stats {
		out[st.ID] = feedHealth(st)
	}
	return out
}

func feedHealth(st kvindex.ReplicaStats) *KVFeedHealth {
	h := &KVFeedHealth{Healthy: st.Healthy && st.Fresh}
	switch {
	case !st.Healthy:
		h.Reason = "stores_not_landing: " + st.Unhealthy
	case !st.Fresh:
		h.Reason = "not_fresh"
	}
	return h
}
