package module

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/fleetstate"
)

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
	cfg      enginemetrics.Settings
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
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	if err := register(ctx.GetMetricsRegistry(), engineCollector); err != nil {
		return fmt.Errorf("engine metrics: %w", err)
	}
	key := fleetstate.SettingsKey("ramjet-engines", s.StateKey, c)
	v, _, err := engineStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		e := &engineState{stateKey: s.StateKey, cfg: *c}
		sc := c.Config(resolveSecret(c.UpstreamToken))
		sc.Local, sc.OnSnapshot = e.feed.Local, e.feed.Push
		var err error
		if e.sc, err = enginemetrics.New(sc); err != nil {
			return nil, err
		}
		e.sc.Start(context.Background()) // outlives this config (a reload keeps it): stops in Destruct
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

// retarget sets the scraper's targets from the upstream pools of the
// fleet's live policies (enginemetrics.TargetsFor), after a pool change;
// nil (no engine_metrics) does nothing.
func (e *engineState) retarget() {
	if e == nil || e.fleet.Load() == nil {
		return
	}
	f := e.fleet.Load()
	var reps []enginemetrics.DialReplica
	f.mu.Lock()
	for _, v := range f.views {
		for i, up := range v.pool {
			if v.Slots[i] >= 0 {
				reps = append(reps, enginemetrics.DialReplica{Dial: up.Dial,
					ReplicaRef: enginemetrics.ReplicaRef{Key: v.Keys[i], ID: v.IDs[i], Rank: v.Ranks[i]}})
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
