package module

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/upstream"
)

// EngineMetricsConfig turns on scraping of every upstream engine's
// Prometheus metrics (vLLM's vllm:* or SGLang's sglang:* series, package
// enginemetrics): running and waiting requests, KV-cache usage and
// capacity, speculative-decoding counters. Each replica's snapshot, fused
// with this instance's own reservations, is added to the routing load
// (the requests others sent it count as this instance's own do; a stale
// replica counts local reservations only), sets the index's KV capacity
// of the replica, and is shown in the admin API's /ramjet/fleet; the
// scrapes are counted in ramjet_engine_* metrics. Off by default; with
// it off nothing is scraped.
type EngineMetricsConfig struct {
	// Interval is the time between two scrapes of each engine.
	// Default: 1s. In the Caddyfile: engine_metrics [<interval>] { ... }.
	Interval caddy.Duration `json:"interval,omitempty" caddyfile:"arg"`
	// Timeout bounds one scrape. Default: the interval, at most 5s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Path is the metrics path on each upstream. Default: "/metrics".
	Path string `json:"path,omitempty"`
	// Access is how the engines' metrics are reached: scheme ("http" or
	// "https", default "http") and upstream_token (sent as
	// "Authorization: Bearer <token>", placeholders resolved; default
	// none).
	upstream.Access
	// StaleAfter is how many intervals a replica's last good scrape stays
	// usable while later scrapes fail; past it the replica counts as
	// stale (local reservations only). Default: 3.
	StaleAfter int `json:"stale_after,omitempty"`
	// MaxBodyBytes bounds one metrics page, in bytes. Default: 4 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// Concurrency bounds the scrapes in flight. Default: 8.
	Concurrency int `json:"concurrency,omitempty"`
}

func (c *EngineMetricsConfig) setDefaults() {
	if c.Path == "" {
		c.Path = "/metrics"
	}
	c.Access.SetDefaults()
}

func (c *EngineMetricsConfig) validate() error {
	if c.Path[0] != '/' {
		return fmt.Errorf("engine_metrics: path must start with '/', got %q", c.Path)
	}
	if err := c.Access.Validate("engine_metrics"); err != nil {
		return err
	}
	if err := c.scraperConfig().Validate(); err != nil {
		return fmt.Errorf("engine_metrics: %w", err)
	}
	return nil
}

func (c *EngineMetricsConfig) scraperConfig() enginemetrics.Config {
	return enginemetrics.Config{Interval: time.Duration(c.Interval), Timeout: time.Duration(c.Timeout),
		MaxBodyBytes: c.MaxBodyBytes, Concurrency: c.Concurrency, StaleAfter: c.StaleAfter,
		Token: resolveSecret(c.UpstreamToken)}
}

// engineStates holds the scrapers across config reloads, keyed by
// state_key and the engine_metrics configuration.
var engineStates = caddy.NewUsagePool()

// engineCollector exports every live scraper's ramjet_engine_* series.
var engineCollector = enginemetrics.NewCollector()

// engineLive maps each state_key to its scraper provisioned last, for
// /ramjet/fleet.
var engineLive fleetstate.Latest[*engineState]

// engineState is one fleet's scraper, kept across reloads, fed by the
// router of the fleet provisioned last.
type engineState struct {
	stateKey string
	cfg      EngineMetricsConfig
	sc       *enginemetrics.Scraper
	feed     enginemetrics.RouterFeed
	fleet    atomic.Pointer[fleet] // the last provisioned; for targets
}

// Destruct stops the scraper: the last policy using it was cleaned up.
func (e *engineState) Destruct() error {
	engineLive.Drop(e.stateKey, e)
	engineCollector.Remove(e.sc)
	return e.sc.Close()
}

func (s *RamjetSelection) provisionEngines(ctx caddy.Context) error {
	c := s.EngineMetrics
	if c == nil {
		return nil
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		return err
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := metrics.Register(reg, engineCollector); err != nil {
			return fmt.Errorf("engine metrics: %w", err)
		}
	}
	b, _ := json.Marshal(c)
	key := fmt.Sprintf("ramjet-engines/%s/%016x", s.StateKey, xxhash.Sum64(b))
	v, _, err := engineStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		e := &engineState{stateKey: s.StateKey, cfg: *c}
		sc := c.scraperConfig()
		sc.Local, sc.OnSnapshot = e.feed.Local, e.feed.Push
		var err error
		if e.sc, err = enginemetrics.New(sc); err != nil {
			return nil, err
		}
		// The scraper outlives this config (a reload with the same
		// settings keeps it): it stops in Destruct.
		e.sc.Start(context.Background())
		engineCollector.Add(e.sc, s.StateKey)
		return e, nil
	})
	if err != nil {
		return fmt.Errorf("engine_metrics: %w", err)
	}
	s.engines, s.enginesKey = v.(*engineState), key
	s.engines.fleet.Store(s.fleet)
	s.engines.feed.Set(s.fleet.Base())
	engineLive.Set(s.StateKey, s.engines)
	s.engines.retarget()
	return nil
}

func (s *RamjetSelection) cleanupEngines() error {
	e := s.engines
	if e == nil {
		return nil
	}
	// Stop scraping this policy's pool now, not at the next pool change.
	s.fleet.dropView(s)
	e.retarget()
	s.engines = nil
	_, err := engineStates.Delete(s.enginesKey)
	return err
}

// bindEngines points the scraper at the upstreams of the fleet's live
// pools after a pool change.
func (s *RamjetSelection) bindEngines() {
	if s.engines != nil {
		s.engines.retarget()
	}
}

// retarget sets the scraper's targets from the upstream pools of the
// fleet's live policies (enginemetrics.TargetsFor).
func (e *engineState) retarget() {
	f := e.fleet.Load()
	if f == nil {
		return
	}
	var reps []enginemetrics.DialReplica
	f.mu.Lock()
	for _, v := range f.views {
		for i, up := range v.pool {
			if v.slots[i] >= 0 {
				reps = append(reps, enginemetrics.DialReplica{Dial: up.Dial,
					ReplicaRef: enginemetrics.ReplicaRef{Key: v.keys[i], ID: v.ids[i], Rank: v.ranks[i]}})
			}
		}
	}
	f.mu.Unlock()
	e.sc.SetTargets(enginemetrics.TargetsFor(e.cfg.Scheme, e.cfg.Path, reps))
}

// engineStatesOf returns the engine states of fleet stateKey's replicas,
// by upstream id; nil when engine_metrics is off.
func engineStatesOf(stateKey string) []fleetstate.EngineState {
	e, _ := engineLive.Get(stateKey)
	if e == nil {
		return nil
	}
	return fleetstate.EngineStates(e.sc.Snapshots(), time.Now())
}
