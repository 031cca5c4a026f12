package fleetstate

import "github.com/ramjet-llm/ramjet/kvindex"

// KVFeeds is the /health view of the precise index's feeds, by replica
// key.
func KVFeeds(stats []kvindex.ReplicaStats) map[string]*KVFeedHealth {
	out := make(map[string]*KVFeedHealth, len(stats))
	for _, st := range stats {
		if st.ID == "" {
			continue // a departed replica's handle (kvindex.Index.Retire)
		}
		h := &KVFeedHealth{Healthy: st.Healthy && st.Fresh}
		switch {
		case !st.Healthy:
			h.Reason = "stores_not_landing: " + st.Unhealthy
		case !st.Fresh:
			h.Reason = "not_fresh"
		}
		out[st.ID] = h
	}
	return out
}
