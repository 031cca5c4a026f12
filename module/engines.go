package module

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/fleetstate"
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
	// Default: 1s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// Timeout bounds one scrape. Default: the interval, at most 5s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Path is the metrics path on each upstream. Default: "/metrics".
	Path string `json:"path,omitempty"`
	// Scheme is how the engines' metrics are reached: "http" or "https".
	// Default: "http".
	Scheme string `json:"scheme,omitempty"`
	// UpstreamToken is sent to the engines as "Authorization: Bearer
	// <token>"; placeholders such as {env.RJ_UPSTREAM_TOKEN} are
	// resolved. Default: none.
	UpstreamToken string `json:"upstream_token,omitempty"`
	// StaleAfter is how many intervals a replica's last good scrape stays
	// usable while later scrapes fail; past it the replica counts as
	// stale (local reservations only). Default: 3.
	StaleAfter int `json:"stale_after,omitempty"`
	// MaxBodyBytes bounds one metrics page, in bytes. Default: 4 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// Concurrency bounds the scrapes in flight. Default: 8.
	Concurrency int `json:"concurrency,omitempty"`
}

// unmarshalEngineMetrics parses the policy's engine_metrics option:
//
//	engine_metrics [<interval>] [{
//		path           <path>
//		timeout        <duration>
//		scheme         http|https
//		upstream_token <token>
//		stale_after    <intervals>
//		max_body_bytes <size>
//		concurrency    <n>
//	}]
func (c *EngineMetricsConfig) unmarshalEngineMetrics(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) > 1 {
		return d.Errf("engine_metrics: want at most one interval")
	}
	if len(args) == 1 {
		v, err := caddy.ParseDuration(args[0])
		if err != nil {
			return d.Errf("engine_metrics: %q is not a duration", args[0])
		}
		c.Interval = caddy.Duration(v)
	}
	return subBlock(d, "engine_metrics", map[string]blockOption{
		"path":    argString(&c.Path),
		"timeout": argDuration(&c.Timeout),
		"scheme": func(d *caddyfile.Dispenser, o string) error {
			if err := argString(&c.Scheme)(d, o); err != nil {
				return err
			}
			if c.Scheme != "http" && c.Scheme != "https" {
				return d.Errf("engine_metrics: scheme must be http or https")
			}
			return nil
		},
		"upstream_token": argString(&c.UpstreamToken),
		"stale_after":    argInt(&c.StaleAfter),
		"max_body_bytes": argSize(&c.MaxBodyBytes),
		"concurrency":    argInt(&c.Concurrency),
	})
}

func (c *EngineMetricsConfig) setDefaults() {
	if c.Path == "" {
		c.Path = "/metrics"
	}
	if c.Scheme == "" {
		c.Scheme = "http"
	}
}

func (c *EngineMetricsConfig) validate() error {
	switch {
	case c.Path[0] != '/':
		return fmt.Errorf("engine_metrics: path must start with '/', got %q", c.Path)
	case c.Scheme != "http" && c.Scheme != "https":
		return fmt.Errorf("engine_metrics: scheme must be http or https, got %q", c.Scheme)
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

// engineState is one fleet's scraper, kept across reloads.
type engineState struct {
	stateKey string
	cfg      EngineMetricsConfig
	sc       *enginemetrics.Scraper
	fleet    atomic.Pointer[fleet] // the last provisioned; for targets and local load
}

// Destruct stops the scraper: the last policy using it was cleaned up.
func (e *engineState) Destruct() error {
	engineLive.Drop(e.stateKey, e)
	engineCollector.Remove(e.sc)
	return e.sc.Close()
}

// local is the scraper's view of this instance's reservations.
func (e *engineState) local(key string) enginemetrics.Local {
	f := e.fleet.Load()
	if f == nil {
		return enginemetrics.Local{}
	}
	s, ok := f.Base().Lookup(key)
	if !ok {
		return enginemetrics.Local{}
	}
	in, pend := f.Base().Load(s)
	return enginemetrics.Local{Inflight: in, PendingPrefill: pend, ResidentTokens: f.Base().Resident(s)}
}

// push hands a replica's new snapshot to the fleet's router: the load
// that this instance did not reserve (enginemetrics.Fuse; zeros when
// stale, so that routing falls back to local reservations) and the
// engine's KV capacity, when it reports one.
func (e *engineState) push(sn enginemetrics.Snapshot) {
	f := e.fleet.Load()
	if f == nil {
		return
	}
	s, ok := f.Base().Lookup(sn.Key)
	if !ok {
		return
	}
	ext := enginemetrics.Fuse(sn, time.Now())
	f.Base().SetExternalLoad(s, ext.Running, ext.Waiting, ext.KVUsedTokens)
	if c := ext.KVCapacityTokens; c > 0 {
		// The index applies whole blocks; set it only when it changed.
		bt := int64(f.Base().Config().BlockTokens)
		if max(1, c/bt)*bt != f.Base().Capacity(s) {
			f.Base().SetCapacity(s, c)
		}
	}
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
		var are prometheus.AlreadyRegisteredError
		if err := reg.Register(engineCollector); err != nil && !errors.As(err, &are) {
			return fmt.Errorf("engine metrics: %w", err)
		}
	}
	b, _ := json.Marshal(c)
	key := fmt.Sprintf("ramjet-engines/%s/%016x", s.StateKey, xxhash.Sum64(b))
	v, _, err := engineStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		e := &engineState{stateKey: s.StateKey, cfg: *c}
		sc := c.scraperConfig()
		sc.Local, sc.OnSnapshot = e.local, e.push
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
// fleet's live policies: one target per dial address; a dial listed once
// is one replica (the whole engine), listed k times k data-parallel ranks.
func (e *engineState) retarget() {
	f := e.fleet.Load()
	if f == nil {
		return
	}
	byDial := map[string][]enginemetrics.ReplicaRef{}
	seen := map[string]bool{}
	f.mu.Lock()
	for _, v := range f.views {
		for i, up := range v.pool {
			if v.slots[i] < 0 || seen[v.keys[i]] {
				continue
			}
			seen[v.keys[i]] = true
			byDial[up.Dial] = append(byDial[up.Dial], enginemetrics.ReplicaRef{Key: v.keys[i], ID: v.ids[i], Rank: v.ranks[i]})
		}
	}
	f.mu.Unlock()
	dials := make([]string, 0, len(byDial))
	for d := range byDial {
		dials = append(dials, d)
	}
	sort.Strings(dials)
	ts := make([]enginemetrics.Target, 0, len(dials))
	for _, d := range dials {
		ts = append(ts, enginemetrics.Target{URL: e.cfg.Scheme + "://" + d + e.cfg.Path, Replicas: byDial[d]})
	}
	e.sc.SetTargets(ts)
}

// engineStatesOf returns the engine states of fleet stateKey's replicas,
// by upstream id; nil when engine_metrics is off.
func engineStatesOf(stateKey string) []fleetstate.EngineState {
	e, _ := engineLive.Get(stateKey)
	if e == nil {
		return nil
	}
	now := time.Now()
	snaps := e.sc.Snapshots()
	out := make([]fleetstate.EngineState, 0, len(snaps))
	for _, sn := range snaps {
		if sn.ID == "" {
			continue
		}
		es := fleetstate.EngineState{Upstream: sn.ID, State: sn.State(now).String(), Result: sn.Result.String(),
			Engine: sn.Engine.String(), Metrics: sn.Metrics, ConsecutiveFailures: sn.Failures,
			Local: sn.Local, External: enginemetrics.Fuse(sn, now)}
		if sn.AttemptedAt.IsZero() {
			es.Result = ""
		}
		if !sn.ScrapedAt.IsZero() {
			t := sn.ScrapedAt
			es.ScrapedAt, es.AgeSeconds = &t, now.Sub(t).Seconds()
		}
		out = append(out, es)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Upstream < out[j].Upstream })
	return out
}
