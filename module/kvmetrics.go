package module

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/kvindex"
	"github.com/ramjet-llm/ramjet/metrics"
)

// kvSources lists every live precise index (kvLive), by state_key, for
// the kv collector.
func kvSources() []metrics.KVSource {
	states := kvLive.Values()
	out := make([]metrics.KVSource, len(states))
	for i, k := range states {
		f := k.fleet.Load()
		out[i] = metrics.KVSource{Precise: k.p, Latency: k.tokLatency.Snapshot, RouteID: func(key string) string {
			if f == nil {
				return ""
			}
			return f.RouteID(key)
		}, Foreign: k.fp.Counted, Fleet: k.stateKey, Decays: k.fp.Decays, Share: k.fp.Share}
	}
	return out
}

// kvCollector is the kv collector, created once and registered into every
// config's metrics registry.
var kvCollector = sync.OnceValue(func() prometheus.Collector { return metrics.NewKVCollector(kvSources) })

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
	return fleetstate.KVFeeds(pf.kv.p.Index().AppendReplicaStats(nil))
}

// KVPreflightReport is what the precise path of one state key recorded of
// its tokenize preflights and predictions (kvindex.PreflightReport).
type KVPreflightReport = kvindex.PreflightReport

// KVPreflight returns the report of the precise path provisioned last for
// stateKey, and false when it has none.
func KVPreflight(stateKey string) (KVPreflightReport, bool) {
	k, _ := kvLive.Get(stateKey)
	if k == nil {
		return KVPreflightReport{}, false
	}
	return kvindex.NewPreflightReport(k.p, k.tokLatency), true
}
