package enginemetrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ramjet-llm/ramjet/latency"
)

// Defaults of Config's zero fields.
const (
	DefaultInterval     = time.Second
	DefaultMaxBodyBytes = 4 << 20
	DefaultConcurrency  = 8
	DefaultStaleAfter   = 3
)

// Config configures a Scraper. Zero fields take the defaults.
type Config struct {
	// Interval is the time between two scrapes of every target. Default 1s.
	Interval time.Duration
	// Timeout bounds one scrape (connect, headers and body). Default:
	// Interval, at most 5s.
	Timeout time.Duration
	// MaxBodyBytes bounds a /metrics page; a larger one is an error.
	// Default 4 MiB (a vLLM page is 50-300 KB).
	MaxBodyBytes int64
	// Concurrency bounds the scrapes in flight. Default 8.
	Concurrency int
	// StaleAfter is how many intervals a good scrape stays usable when
	// the scrapes after it fail; past it the replica is stale and falls
	// back to local reservations. Default 3.
	StaleAfter int
	// Token, when set, is sent as "Authorization: Bearer <Token>".
	Token string
	// Client, when set, sends the scrapes (its Timeout is left as is;
	// Config.Timeout still bounds each scrape). Default: a client of the
	// Scraper's own, closed with it.
	Client *http.Client
	// Local, when set, returns this ramjet instance's reservations on the
	// replica named key; the scraper records them around each scrape so
	// that Fuse can tell this instance's requests from everyone else's.
	Local func(key string) Local
	// OnSnapshot, when set, is called (on the scraper's goroutine) after
	// every scrape attempt with each replica's new snapshot.
	OnSnapshot func(Snapshot)
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout == 0 {
		c.Timeout = min(c.Interval, 5*time.Second)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.StaleAfter == 0 {
		c.StaleAfter = DefaultStaleAfter
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate rejects unusable settings, naming the field.
func (c Config) Validate() error {
	switch {
	case c.Interval < 0:
		return fmt.Errorf("interval must be positive, got %v", c.Interval)
	case c.Timeout < 0:
		return fmt.Errorf("timeout must be positive, got %v", c.Timeout)
	case c.MaxBodyBytes < 0:
		return fmt.Errorf("max_body_bytes must be positive, got %d", c.MaxBodyBytes)
	case c.Concurrency < 0:
		return fmt.Errorf("concurrency must be positive, got %d", c.Concurrency)
	case c.StaleAfter < 0:
		return fmt.Errorf("stale_after must be positive, got %d", c.StaleAfter)
	}
	return nil
}

// Target is one engine's /metrics endpoint and the replicas it describes.
type Target struct {
	// URL is the full metrics URL, e.g. "http://10.0.0.5:8000/metrics".
	URL string
	// Header is added to every scrape (optional).
	Header http.Header
	// Replicas are the routed replicas behind this engine.
	Replicas []ReplicaRef
}

// ReplicaRef names one routed replica of a target.
type ReplicaRef struct {
	// Key is the replica's routing key (selection.Router's: the dial
	// address, plus "#rank"). Internal: never exposed by the Collector.
	Key string
	// ID is the replica's opaque id, the Collector's upstream label ("":
	// no per-replica series).
	ID string
	// Rank is the engine's data-parallel rank this replica is, or -1 for
	// the whole engine (the sum over its ranks).
	Rank int
}

// Result classifies a scrape attempt (the Collector's result label).
type Result uint8

// Scrape results.
const (
	ResultOK       Result = iota
	ResultTimeout         // no complete answer within Timeout
	ResultError           // connection or transport error
	ResultStatus          // a status other than 200
	ResultTooLarge        // body past MaxBodyBytes
	ResultParse           // not Prometheus text, or no engine metrics in it
	numResults
)

// Results lists every Result, in order.
var Results = [numResults]Result{ResultOK, ResultTimeout, ResultError, ResultStatus, ResultTooLarge, ResultParse}

var resultNames = [numResults]string{"ok", "timeout", "error", "status", "too_large", "parse"}

func (r Result) String() string { return resultNames[r] }

// MarshalText makes a Result a JSON string.
func (r Result) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Local is this ramjet instance's own reservations on a replica, in
// selection.Router's units (Router.Load, Router.Resident).
type Local struct {
	Inflight       int64 `json:"inflight"`
	PendingPrefill int64 `json:"pending_prefill_tokens"`
	// ResidentTokens is the KV context of this instance's in-flight
	// requests, when it is tracked (0: unknown).
	ResidentTokens int64 `json:"resident_tokens"`
}

func maxLocal(a, b Local) Local {
	return Local{Inflight: max(a.Inflight, b.Inflight), PendingPrefill: max(a.PendingPrefill, b.PendingPrefill),
		ResidentTokens: max(a.ResidentTokens, b.ResidentTokens)}
}

// State is a snapshot's condition at a point in time.
type State uint8

// Snapshot states.
const (
	// StatePending: no scrape has completed yet.
	StatePending State = iota
	// StateOK: the last scrape succeeded.
	StateOK
	// StateError: the last scrape failed; the last good figures are still
	// within StaleAfter intervals and used.
	StateError
	// StateStale: no good scrape within StaleAfter intervals; the replica
	// falls back to local reservations.
	StateStale
)

var stateNames = [...]string{"pending", "ok", "error", "stale"}

func (s State) String() string { return stateNames[s] }

// MarshalText makes a State a JSON string.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Snapshot is one replica's engine-reported figures as of its last good
// scrape, and how the scrapes since went.
type Snapshot struct {
	// Key is the replica's routing key (internal: an address).
	Key string `json:"-"`
	// ID is the replica's opaque id.
	ID string `json:"upstream"`
	// Engine is the kind of engine of the last good scrape.
	Engine Engine `json:"engine"`
	// Metrics are the last good scrape's figures for this replica.
	Metrics RankMetrics `json:"metrics"`
	// Local is this instance's reservations around the last good scrape
	// (the larger of before and after).
	Local Local `json:"local_at_scrape"`
	// ScrapedAt is when the last good scrape completed (zero: never);
	// AttemptedAt when the last attempt did.
	ScrapedAt   time.Time `json:"scraped_at"`
	AttemptedAt time.Time `json:"attempted_at"`
	// Duration is the last attempt's duration.
	Duration time.Duration `json:"duration_ns"`
	// Result classifies the last attempt (ResultParse also when the page
	// lacks this replica's rank). Err is its error, "" when it succeeded:
	// it may name the engine's address. Failures counts the consecutive
	// failed attempts.
	Result   Result `json:"result"`
	Err      string `json:"error,omitempty"`
	Failures int    `json:"consecutive_failures"`
	// StaleAfter is how long a good scrape stays usable.
	StaleAfter time.Duration `json:"stale_after_ns"`
}

// Fresh reports whether the last good figures may be used at now.
func (s Snapshot) Fresh(now time.Time) bool {
	return !s.ScrapedAt.IsZero() && now.Sub(s.ScrapedAt) <= s.StaleAfter
}

// State returns the snapshot's state at now.
func (s Snapshot) State(now time.Time) State {
	switch {
	case s.AttemptedAt.IsZero():
		return StatePending
	case !s.Fresh(now):
		return StateStale
	case s.Err != "":
		return StateError
	}
	return StateOK
}

// Scraper scrapes its targets' /metrics on an interval. Safe for
// concurrent use; Start it once and Close it.
type Scraper struct {
	cfg       Config
	client    *http.Client
	transport *http.Transport // owned; nil with Config.Client

	mu      sync.Mutex
	targets []Target
	snaps   map[string]*Snapshot

	results [numResults]atomic.Uint64
	dur     *latency.Hist

	start   sync.Once
	cancel  context.CancelFunc
	done    chan struct{}
	closed  atomic.Bool
	running atomic.Bool
}

// New returns a Scraper for cfg (defaults filled in) with no targets.
func New(cfg Config) (*Scraper, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s := &Scraper{cfg: cfg, client: cfg.Client, snaps: map[string]*Snapshot{}, dur: latency.New(durationBuckets)}
	if s.client == nil {
		s.transport = &http.Transport{
			Proxy:                 nil, // engines are dialed directly
			DialContext:           (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   1,
			MaxConnsPerHost:       2,
			IdleConnTimeout:       max(3*cfg.Interval, 30*time.Second),
			ResponseHeaderTimeout: cfg.Timeout,
			TLSHandshakeTimeout:   cfg.Timeout,
			ForceAttemptHTTP2:     false,
		}
		s.client = &http.Client{Transport: s.transport}
	}
	return s, nil
}

// Config returns the scraper's configuration, defaults filled in.
func (s *Scraper) Config() Config { return s.cfg }

// SetTargets replaces the targets. Snapshots of replicas that are still
// listed are kept; the others are dropped. Replica keys must be unique.
func (s *Scraper) SetTargets(ts []Target) {
	cp := make([]Target, len(ts))
	keep := map[string]bool{}
	for i, t := range ts {
		cp[i] = Target{URL: t.URL, Header: t.Header.Clone(), Replicas: append([]ReplicaRef(nil), t.Replicas...)}
		for _, r := range t.Replicas {
			keep[r.Key] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.targets = cp
	for k := range s.snaps {
		if !keep[k] {
			delete(s.snaps, k)
		}
	}
	for _, t := range cp {
		for _, r := range t.Replicas {
			if sn := s.snaps[r.Key]; sn != nil {
				sn.ID = r.ID
			} else {
				s.snaps[r.Key] = &Snapshot{Key: r.Key, ID: r.ID, Metrics: RankMetrics{Rank: r.Rank},
					StaleAfter: s.staleAfter()}
			}
		}
	}
}

// Targets returns the current targets.
func (s *Scraper) Targets() []Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Target(nil), s.targets...)
}

func (s *Scraper) staleAfter() time.Duration {
	return time.Duration(s.cfg.StaleAfter) * s.cfg.Interval
}

// Snapshot returns the replica's snapshot.
func (s *Scraper) Snapshot(key string) (Snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn := s.snaps[key]
	if sn == nil {
		return Snapshot{}, false
	}
	return sn.clone(), true
}

// Snapshots returns every replica's snapshot, sorted by key.
func (s *Scraper) Snapshots() []Snapshot {
	s.mu.Lock()
	out := make([]Snapshot, 0, len(s.snaps))
	for _, sn := range s.snaps {
		out = append(out, sn.clone())
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func (sn *Snapshot) clone() Snapshot {
	c := *sn
	c.Metrics.Spec.AcceptedPerPos = append([]uint64(nil), sn.Metrics.Spec.AcceptedPerPos...)
	return c
}

// Results returns how many scrapes ended with each Result.
func (s *Scraper) Results() [numResults]uint64 {
	var out [numResults]uint64
	for i := range out {
		out[i] = s.results[i].Load()
	}
	return out
}

// Start scrapes every target at once and then every Interval, until ctx
// ends or Close. Later calls do nothing.
func (s *Scraper) Start(ctx context.Context) {
	s.start.Do(func() {
		if s.closed.Load() {
			return
		}
		ctx, s.cancel = context.WithCancel(ctx)
		s.done = make(chan struct{})
		s.running.Store(true)
		go s.run(ctx)
	})
}

func (s *Scraper) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.ScrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close stops the scraping goroutine, waits for it, and closes the idle
// connections of the scraper's own client.
func (s *Scraper) Close() error {
	s.closed.Store(true)
	s.start.Do(func() {}) // a later Start does nothing
	if s.running.Load() {
		s.cancel()
		<-s.done
	}
	if s.transport != nil {
		s.transport.CloseIdleConnections()
	}
	return nil
}

// ScrapeOnce scrapes every target once, at most Concurrency at a time,
// and returns when all are done (each bounded by Timeout).
func (s *Scraper) ScrapeOnce(ctx context.Context) {
	ts := s.Targets()
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, t := range ts {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.scrape(ctx, t)
		}()
	}
	wg.Wait()
}

func (s *Scraper) local(t Target) []Local {
	if s.cfg.Local == nil {
		return nil
	}
	out := make([]Local, len(t.Replicas))
	for i, r := range t.Replicas {
		out[i] = s.cfg.Local(r.Key)
	}
	return out
}

// scrape fetches one target and updates its replicas' snapshots.
func (s *Scraper) scrape(ctx context.Context, t Target) {
	before := s.local(t)
	start := s.cfg.Now()
	m, res, err := s.fetch(ctx, t)
	end := s.cfg.Now()
	after := s.local(t)
	if ctx.Err() != nil && res != ResultOK {
		return // shutting down: not the engine's fault
	}
	s.results[res].Add(1)
	s.dur.Observe(end.Sub(start))

	updated := make([]Snapshot, 0, len(t.Replicas))
	s.mu.Lock()
	for i, r := range t.Replicas {
		sn := s.snaps[r.Key]
		if sn == nil {
			continue // dropped by SetTargets meanwhile
		}
		sn.AttemptedAt, sn.Duration = end, end.Sub(start)
		rerr, rres := err, res
		var rm RankMetrics
		if rerr == nil {
			var ok bool
			if rm, ok = m.Rank(r.Rank); !ok {
				rerr, rres = fmt.Errorf("rank %d not reported by the engine", r.Rank), ResultParse
			}
		}
		sn.Result = rres
		if rerr != nil {
			sn.Err = rerr.Error()
			sn.Failures++
		} else {
			sn.Err, sn.Failures = "", 0
			sn.Engine, sn.Metrics, sn.ScrapedAt = m.Engine, rm, end
			sn.Local = Local{}
			if before != nil {
				sn.Local = maxLocal(before[i], after[i])
			}
		}
		if s.cfg.OnSnapshot != nil {
			updated = append(updated, sn.clone())
		}
	}
	s.mu.Unlock()
	for _, sn := range updated {
		s.cfg.OnSnapshot(sn)
	}
}

// bufPool holds scrape buffers (bounded by MaxBodyBytes each).
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// fetch GETs t.URL, bounded by Timeout and MaxBodyBytes, and parses it.
func (s *Scraper) fetch(ctx context.Context, t Target) (Metrics, Result, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return Metrics{}, ResultError, fmt.Errorf("metrics request: %w", err)
	}
	for k, v := range t.Header {
		req.Header[k] = v
	}
	// The classic text format: prometheus_client answers OpenMetrics only
	// when asked for it.
	req.Header.Set("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	if s.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.Token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return Metrics{}, classify(ctx, err), fmt.Errorf("scraping metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		return Metrics{}, ResultStatus, fmt.Errorf("scraping metrics: status %d", resp.StatusCode)
	}
	if resp.ContentLength > s.cfg.MaxBodyBytes {
		return Metrics{}, ResultTooLarge, fmt.Errorf("scraping metrics: body of %d bytes exceeds %d", resp.ContentLength, s.cfg.MaxBodyBytes)
	}
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= 1<<20 {
			bufPool.Put(buf)
		}
	}()
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, s.cfg.MaxBodyBytes+1))
	if err != nil {
		return Metrics{}, classify(ctx, err), fmt.Errorf("reading metrics: %w", err)
	}
	if n > s.cfg.MaxBodyBytes {
		return Metrics{}, ResultTooLarge, fmt.Errorf("scraping metrics: body exceeds %d bytes", s.cfg.MaxBodyBytes)
	}
	m, err := ParseBytes(buf.Bytes())
	if err != nil {
		return Metrics{}, ResultParse, err
	}
	return m, ResultOK, nil
}

func classify(ctx context.Context, err error) Result {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded ||
		(errors.As(err, &ne) && ne.Timeout()) {
		return ResultTimeout
	}
	return ResultError
}

// durationBuckets are the scrape-duration histogram's upper bounds (s).
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}
