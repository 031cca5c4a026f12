package module

import (
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

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
		}, Foreign: k.fp.Counted}
	}
	return out
}

// kvCollector is the kv collector, created once and registered into every
// config's metrics registry.
var kvCollector = sync.OnceValue(func() prometheus.Collector { return metrics.NewKVCollector(kvSources) })

// registerKVMetrics registers the kv collector into the config's registry.
func registerKVMetrics(ctx caddy.Context) error {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return nil
	}
	return metrics.Register(reg, kvCollector())
}
