package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/peerproxy"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// Peers are the fleet simulation's reimplementations of the peers' routers
// that e2ecompare runs through the real Caddy (bench/peerproxy), by their
// fleetsim names: SGLang's cache_aware, llm-d's scorers, Dynamo's KV cost,
// each default and tuned.
var Peers = []string{"sglang", "sglang-tuned", "llm-d", "llm-d-precise", "dynamo", "dynamo-tuned"}

func isPeer(pol string) bool { return slices.Contains(Peers, pol) }

// peerNeedsKV reports whether peer pol reads the engines' KV events.
func peerNeedsKV(pol string) bool {
	if !isPeer(pol) {
		return false
	}
	p, err := fleetsim.NewPolicy(pol, 0, selection.Config{})
	return err == nil && fleetsim.WantsEngineHashes(p)
}

// peerSite is the Caddy site "lb" routing with fleetsim policy pol over
// the engines sims at addrs (the bench_peer handler and selection policy),
// its Adapter started (metrics scraped every 50 ms wall, KV events from
// the engines' PUB sockets when pol reads them; seed as fleetsim's -seed).
// stop closes the adapter; the adapter's counters are read from it.
func peerSite(ctx context.Context, pol string, seed uint64, w *workload.Workload, sims []*enginesim.Server, addrs []string) (caddyrun.Site, *peerproxy.Adapter, func(), error) {
	cfg := peerproxy.Config{Policy: pol, Seed: seed, Upstreams: addrs, Speculative: w.Speculative}
	for i, s := range sims {
		cfg.Metrics = append(cfg.Metrics, s.URL()+"/metrics")
		if peerNeedsKV(pol) {
			eps := s.KVEndpoints()
			if len(eps) == 0 {
				return caddyrun.Site{}, nil, nil, fmt.Errorf("%s reads KV events: engine %d publishes none (-kv-events all)", pol, i)
			}
			cfg.KVEvents = append(cfg.KVEvents, eps[0])
		}
	}
	ec := sims[0].Options().Engine
	ec.SetDefaults()
	cfg.KVCapacity, cfg.BlockSize, cfg.HashSeed = engineCapacity(sims), ec.BlockSize, ec.HashSeed
	a, err := peerproxy.New(cfg)
	if err != nil {
		return caddyrun.Site{}, nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	a.Start(ctx)
	name := "e2ecompare-" + pol
	unregister := peerproxy.Register(name, a)
	stop := func() {
		unregister()
		cancel()
		_ = a.Close()
	}
	site := caddyrun.Site{Name: "lb", Policy: "bench_peer", PolicyConfig: map[string]any{"name": name}, Upstreams: addrs,
		Handlers: []map[string]any{{"handler": "bench_peer", "name": name}}}
	return site, a, stop, nil
}
