package module

import "github.com/ramjet-llm/ramjet/fleetstate"

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
	return fleetstate.KVFeeds(pf.kv.x.AppendReplicaStats(nil))
}
