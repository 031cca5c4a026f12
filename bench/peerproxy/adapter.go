package peerproxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/enginemetrics"
	"github.com/ramjet-llm/ramjet/selection"
)

// DefaultScrapeInterval is how often the engines' metrics are scraped:
// the interval of llm-d's endpoint picker (50 ms).
const DefaultScrapeInterval = 50 * time.Millisecond

// Config configures an Adapter.
type Config struct {
	// Policy is the fleetsim policy name (sglang, sglang-tuned, llm-d,
	// dynamo, ...); Seed drives its random choices (fleetsim.NewPolicy).
	Policy string
	Seed   uint64
	// Upstreams are the engines' dial addresses, in replica order.
	Upstreams []string
	// Metrics are the engines' /metrics URLs, by replica; nil: no scrape
	// (Waiting, Running and KV usage read 0).
	Metrics []string
	// ScrapeInterval is the metrics scrape interval (wall time). Default
	// DefaultScrapeInterval.
	ScrapeInterval time.Duration
	// KVEvents are the engines' KV event PUB endpoints, by replica; the
	// policies that read KV events need them.
	KVEvents []string
	// Speculative lists the replicas that decode speculatively.
	Speculative []int
	// KVCapacity is each engine's KV capacity in tokens (the replicas'
	// KVCapacity), and Engine the engines' hashing: block size and hash
	// seed (defaults of engine.Config when zero).
	KVCapacity int
	BlockSize  int
	HashSeed   uint64
}

// Adapter runs one fleetsim policy over live engines. Its methods are safe
// for concurrent use: one mutex serialises the policy's calls, which
// fleetsim makes from one goroutine.
type Adapter struct {
	cfg     Config
	byDial  map[string]int
	hashes  bool
	scraper *enginemetrics.Scraper
	subs    *kvFeeds

	mu     sync.Mutex
	pol    fleetsim.Policy
	fleet  []*fleetsim.Replica
	views  []liveEngine
	nextID int
	stats  Stats
}

// Stats counts what the adapter did.
type Stats struct {
	Requests  int // requests tokenized
	Picks     int // Pick calls (a retry picks again)
	Fallbacks int // generation requests not routed by the policy (body too large or not a valid request, pick not in the pool)
	KVEvents  int // KV events applied
	// InFlight is the policy's in-flight count per replica when the
	// stats were read (what its Pick reads): all 0 once every request
	// has ended.
	InFlight []int
}

// liveEngine is a replica's engine metrics as of the decision's start
// (fleetsim.EngineView), copied from the scraper before each Pick so that
// one decision reads one consistent set.
type liveEngine struct {
	waiting, running int
	kv               float64
}

func (e *liveEngine) Waiting() int     { return e.waiting }
func (e *liveEngine) Running() int     { return e.running }
func (e *liveEngine) KVUsage() float64 { return e.kv }

// New returns an Adapter for cfg; Start it, then Close it.
func New(cfg Config) (*Adapter, error) {
	if len(cfg.Upstreams) == 0 || len(cfg.Upstreams) > selection.MaxReplicas {
		return nil, fmt.Errorf("peerproxy: %d upstreams: want 1 to %d", len(cfg.Upstreams), selection.MaxReplicas)
	}
	if cfg.Metrics != nil && len(cfg.Metrics) != len(cfg.Upstreams) {
		return nil, errors.New("peerproxy: one metrics URL per upstream")
	}
	if cfg.ScrapeInterval == 0 {
		cfg.ScrapeInterval = DefaultScrapeInterval
	}
	def := engine.Config{}
	def.SetDefaults()
	if cfg.BlockSize == 0 {
		cfg.BlockSize = def.BlockSize
	}
	if cfg.KVCapacity == 0 {
		cfg.KVCapacity = def.TotalBlocks() * def.BlockSize
	}
	pol, err := fleetsim.NewPolicy(cfg.Policy, cfg.Seed, selection.Config{})
	if err != nil {
		return nil, err
	}
	a := &Adapter{cfg: cfg, pol: pol, byDial: make(map[string]int), hashes: fleetsim.WantsEngineHashes(pol)}
	if a.hashes && len(cfg.KVEvents) != len(cfg.Upstreams) {
		return nil, fmt.Errorf("peerproxy: policy %s reads KV events: one event endpoint per upstream", cfg.Policy)
	}
	a.views = make([]liveEngine, len(cfg.Upstreams))
	for i, u := range cfg.Upstreams {
		if _, dup := a.byDial[u]; dup {
			return nil, fmt.Errorf("peerproxy: upstream %s listed twice", u)
		}
		a.byDial[u] = i
		spec := false
		for _, s := range cfg.Speculative {
			spec = spec || s == i
		}
		a.fleet = append(a.fleet, fleetsim.NewLiveReplica(i, spec, cfg.KVCapacity, &a.views[i], a.hashes))
	}
	if cfg.Metrics != nil {
		sc, err := enginemetrics.New(enginemetrics.Config{Interval: cfg.ScrapeInterval})
		if err != nil {
			return nil, err
		}
		ts := make([]enginemetrics.Target, len(cfg.Metrics))
		for i, u := range cfg.Metrics {
			ts[i] = enginemetrics.Target{URL: u, Replicas: []enginemetrics.ReplicaRef{{Key: cfg.Upstreams[i], Rank: -1}}}
		}
		sc.SetTargets(ts)
		a.scraper = sc
	}
	if a.hashes {
		a.subs = newKVFeeds(cfg.KVEvents, a.applyKV)
	}
	return a, nil
}

// Name is the policy's row label.
func (a *Adapter) Name() string { return a.pol.Name() }

// Start starts the metrics scraper and the KV event feeds; ctx ends them
// as Close does.
func (a *Adapter) Start(ctx context.Context) {
	if a.scraper != nil {
		a.scraper.ScrapeOnce(ctx)
		a.scraper.Start(ctx)
	}
	if a.subs != nil {
		a.subs.start(ctx)
	}
}

// Close stops what Start started.
func (a *Adapter) Close() error {
	var err error
	if a.scraper != nil {
		err = a.scraper.Close()
	}
	if a.subs != nil {
		err = errors.Join(err, a.subs.close())
	}
	return err
}

// Stats returns the adapter's counters.
func (a *Adapter) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.stats
	st.InFlight = make([]int, len(a.fleet))
	for i, r := range a.fleet {
		st.InFlight[i] = r.InFlight
	}
	return st
}

// request is one live request: its fleetsim view and where it went.
type request struct {
	rq    *fleetsim.Request
	rep   int  // replica of the last pick, -1 before
	first bool // FirstToken reported for the last pick
}

// newRequest returns the live request of prompt (the engine's tokens).
func (a *Adapter) newRequest(prompt []uint32) *request {
	a.mu.Lock()
	id := a.nextID
	a.nextID++
	a.stats.Requests++
	a.mu.Unlock()
	row := workload.Request{ID: id, Input: len(prompt), After: -1}
	return &request{rq: fleetsim.NewLiveRequest(row, prompt, a.hashes, a.cfg.HashSeed, a.cfg.BlockSize), rep: -1}
}

// pick routes r: the policy's Pick over the live fleet, then the
// bookkeeping fleetsim.Run does at submission (Routed and InFlight counts,
// the policy's Routed). A request picked again (a retry) first ends its
// earlier attempt (Done).
func (a *Adapter) pick(r *request) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked(r)
	if a.scraper != nil {
		for i, u := range a.cfg.Upstreams {
			if sn, ok := a.scraper.Snapshot(u); ok && !sn.ScrapedAt.IsZero() {
				m := sn.Metrics
				a.views[i] = liveEngine{waiting: int(m.Waiting), running: int(m.Running), kv: m.KVUsage}
			}
		}
	}
	a.stats.Picks++
	rep := a.pol.Pick(r.rq, a.fleet)
	if rep < 0 || rep >= len(a.fleet) {
		return -1
	}
	a.fleet[rep].Routed++
	a.fleet[rep].InFlight++
	a.pol.Routed(r.rq, rep)
	r.rep, r.first = rep, false
	return rep
}

// firstToken reports r's first response byte on its replica.
func (a *Adapter) firstToken(r *request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.rep >= 0 && !r.first {
		r.first = true
		a.pol.FirstToken(r.rq, r.rep)
	}
}

// done reports the end of r's response.
func (a *Adapter) done(r *request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked(r)
}

func (a *Adapter) releaseLocked(r *request) {
	if r.rep < 0 {
		return
	}
	a.fleet[r.rep].InFlight--
	a.pol.Done(r.rq, r.rep)
	r.rep = -1
}

// fallback counts a request the policy did not route.
func (a *Adapter) fallback() {
	a.mu.Lock()
	a.stats.Fallbacks++
	a.mu.Unlock()
}

// applyKV applies one engine KV event of replica rep.
func (a *Adapter) applyKV(rep int, ev engine.KVEvent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fleet[rep].MirrorKV(ev)
	a.stats.KVEvents++
}
