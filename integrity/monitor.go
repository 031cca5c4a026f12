package integrity

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Mode is what a detected acceptance collapse does.
type Mode int

// Modes.
const (
	// ModeObserve reports a collapse (Status.Observed, metrics, a log
	// line) and routes on.
	ModeObserve Mode = iota
	// ModeEnforce commits the instance to the state file and filters the
	// replica out until a different attested instance appears there.
	ModeEnforce
)

func (m Mode) String() string {
	if m == ModeEnforce {
		return "enforce"
	}
	return "observe"
}

// Config configures a Monitor. Zero fields take the defaults.
type Config struct {
	// Pins are the digests an engine must attest (any may be empty).
	Pins Pins
	// IdentityPath is the contract's path. Default DefaultIdentityPath.
	IdentityPath string
	// Interval is the time between two identity checks of a replica.
	// Default 10s.
	Interval time.Duration
	// Timeout bounds one identity fetch. Default 2s.
	Timeout time.Duration
	// Client makes the requests. Default: a client without keep-alive
	// across checks of other monitors (http.DefaultTransport).
	Client *http.Client
	// Spec turns on the acceptance-collapse quarantine; nil: off.
	Spec *SpecConfig
	// Logger receives the admission and quarantine changes. Default: none.
	Logger *zap.Logger
	// OnChange is called (from the monitor's goroutine, never with a lock
	// held) after every round, so that a reader of Out stays current.
	OnChange func()
}

// SpecConfig configures the acceptance-collapse quarantine.
type SpecConfig struct {
	Mode Mode
	// Window is the length of one window: the counters are scraped once
	// per window. Default 10s.
	Window time.Duration
	WindowConfig
	// Source reads the counters. Default: a MetricsSource on "/metrics"
	// with the monitor's client and timeout.
	Source SpecSource
	// Store holds the commitments; required with ModeEnforce.
	Store *Store
	// Key keys the commitments; required with ModeEnforce (at least
	// MinKeyBytes), and must be the Store's key.
	Key []byte
}

// Status is one replica's integrity state.
type Status struct {
	Key string
	// Out: integrity holds the replica out of routing.
	Out bool
	// Reason is why it is out, or what was observed ("" when nothing):
	// an admission reason, or ReasonSpecCollapse / ReasonFenced.
	Reason Reason
	// Attested: the last identity answer was complete and matched every
	// pin.
	Attested bool
	// Quarantined: enforce mode holds it out for a collapse (or a fenced
	// commitment); Durable: the commitment is in the state file.
	Quarantined, Durable bool
	// Observed: observe mode sees a collapse now.
	Observed bool
	// Streak is the current run of zero-acceptance windows; Ratio the last
	// window's acceptance (-1: none yet).
	Streak int
	Ratio  float64
	// Checks counts identity checks by result (ok, failed).
	ChecksOK, ChecksFailed uint64
	// Checked is the time of the last identity check (zero: none yet).
	Checked time.Time
}

type replica struct {
	t        Target
	reason   Reason // admission: ReasonNone when attested
	id       Identity
	checked  time.Time
	ok, fail uint64

	win         *Window
	quarantined bool
	qCommit     string
	durable     bool
	fenced      bool // quarantined because the state file holds the instance
	observed    bool
}

// Monitor checks a set of replicas: identity admission on an interval and,
// when configured, the acceptance-collapse quarantine. Replicas are added
// with Add and start out (ReasonPending) when the monitor filters at all
// (Filters).
type Monitor struct {
	cfg    Config
	client *http.Client
	src    SpecSource

	mu   sync.Mutex
	reps map[string]*replica
	out  map[string]bool // last published Out per key

	writes [2]uint64 // state-file writes: ok, failed

	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// NewMonitor validates cfg and returns a stopped monitor.
func NewMonitor(cfg Config) (*Monitor, error) {
	if err := cfg.Pins.Validate(); err != nil {
		return nil, err
	}
	if cfg.IdentityPath == "" {
		cfg.IdentityPath = DefaultIdentityPath
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m := &Monitor{cfg: cfg, client: cfg.Client, reps: map[string]*replica{}, out: map[string]bool{},
		kick: make(chan struct{}, 1)}
	if m.client == nil {
		m.client = &http.Client{}
	}
	if sc := cfg.Spec; sc != nil {
		c := *sc
		if c.Window <= 0 {
			c.Window = 10 * time.Second
		}
		if c.Windows <= 0 {
			c.Windows = 3
		}
		if c.Position >= MaxPositions {
			return nil, fmt.Errorf("spec position must be below %d, got %d", MaxPositions, c.Position)
		}
		if c.Mode == ModeEnforce {
			if c.Store == nil {
				return nil, errors.New("spec enforce mode needs a state file")
			}
			if len(c.Key) < MinKeyBytes {
				return nil, fmt.Errorf("spec enforce mode needs a commitment key of at least %d bytes", MinKeyBytes)
			}
		}
		m.src = c.Source
		if m.src == nil {
			m.src = &MetricsSource{Client: m.client, Timeout: cfg.Timeout}
		}
		m.cfg.Spec = &c
	}
	return m, nil
}

// Filters reports whether the monitor can hold replicas out: pins are
// configured or the quarantine enforces. Otherwise it only reports.
func (m *Monitor) Filters() bool {
	return m.cfg.Pins.Any() || m.enforce()
}

func (m *Monitor) enforce() bool { return m.cfg.Spec != nil && m.cfg.Spec.Mode == ModeEnforce }

// Add starts checking t (idempotent by key); a new replica is checked at
// once by the running monitor.
func (m *Monitor) Add(t Target) {
	m.mu.Lock()
	if _, ok := m.reps[t.Key]; ok {
		m.mu.Unlock()
		return
	}
	r := &replica{t: t, reason: ReasonPending}
	if m.cfg.Spec != nil {
		r.win = NewWindow(m.cfg.Spec.WindowConfig)
	}
	m.reps[t.Key] = r
	m.out[t.Key] = m.outLocked(r)
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Out reports whether integrity holds the replica out. An unknown key is
// out when the monitor filters (fail closed).
func (m *Monitor) Out(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.reps[key]
	if !ok {
		return m.Filters()
	}
	return m.outLocked(r)
}

func (m *Monitor) outLocked(r *replica) bool {
	if m.enforce() && r.quarantined {
		return true
	}
	return m.Filters() && r.reason != ReasonNone
}

// Status returns one replica's state.
func (m *Monitor) Status(key string) (Status, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.reps[key]
	if !ok {
		return Status{}, false
	}
	return m.statusLocked(r), true
}

// Statuses returns every replica's state, by key.
func (m *Monitor) Statuses() []Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Status, 0, len(m.reps))
	for _, r := range m.reps {
		out = append(out, m.statusLocked(r))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Writes counts the state-file writes by result.
func (m *Monitor) Writes() (ok, failed uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes[0], m.writes[1]
}

// Mode is the quarantine mode; false when the quarantine is off.
func (m *Monitor) Mode() (Mode, bool) {
	if m.cfg.Spec == nil {
		return 0, false
	}
	return m.cfg.Spec.Mode, true
}

func (m *Monitor) statusLocked(r *replica) Status {
	st := Status{Key: r.t.Key, Out: m.outLocked(r), Reason: r.reason, Attested: r.reason == ReasonNone,
		Quarantined: r.quarantined, Durable: r.durable, Observed: r.observed,
		ChecksOK: r.ok, ChecksFailed: r.fail, Checked: r.checked, Ratio: -1}
	if r.win != nil {
		st.Streak, st.Ratio = r.win.Streak(), r.win.LastRatio
	}
	switch {
	case r.quarantined && r.reason == ReasonNone:
		st.Reason = ReasonSpecCollapse
		if r.fenced {
			st.Reason = ReasonFenced
		}
	case r.observed && r.reason == ReasonNone:
		st.Reason = ReasonSpecCollapse
	}
	return st
}

// Start runs the checks until Close. The first round runs at once.
func (m *Monitor) Start(ctx context.Context) {
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go m.run(ctx)
}

// Close stops the checks and waits for the running round.
func (m *Monitor) Close() error {
	if m.cancel == nil {
		return nil
	}
	m.cancel()
	<-m.done
	return nil
}

func (m *Monitor) run(ctx context.Context) {
	defer close(m.done)
	id := time.NewTicker(m.cfg.Interval)
	defer id.Stop()
	var spec <-chan time.Time
	if m.cfg.Spec != nil {
		t := time.NewTicker(m.cfg.Spec.Window)
		defer t.Stop()
		spec = t.C
	}
	m.checkIdentities(ctx, false)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
			m.checkIdentities(ctx, true)
		case <-id.C:
			m.checkIdentities(ctx, false)
		case <-spec:
			m.scrapeSpec(ctx)
		}
	}
}

// CheckNow runs one identity round over every replica (tests, and the
// first check of an operator tool); it is safe alongside a running loop.
func (m *Monitor) CheckNow(ctx context.Context) { m.checkIdentities(ctx, false) }

// ScrapeNow runs one spec-decode window round.
func (m *Monitor) ScrapeNow(ctx context.Context) {
	if m.cfg.Spec != nil {
		m.scrapeSpec(ctx)
	}
}

// targets lists the replicas to check (only the pending ones when
// pendingOnly).
func (m *Monitor) targets(pendingOnly bool) []Target {
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := make([]Target, 0, len(m.reps))
	for _, r := range m.reps {
		if !pendingOnly || r.checked.IsZero() {
			ts = append(ts, r.t)
		}
	}
	return ts
}

// parallel runs f for each target, at most 8 at a time, and waits.
func parallel[T any](ts []Target, f func(Target) T) []T {
	out := make([]T, len(ts))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			out[i] = f(t)
			<-sem
		}()
	}
	wg.Wait()
	return out
}

type idResult struct {
	id  Identity
	err error
}

func (m *Monitor) checkIdentities(ctx context.Context, pendingOnly bool) {
	ts := m.targets(pendingOnly)
	if len(ts) == 0 {
		return
	}
	res := parallel(ts, func(t Target) idResult {
		id, err := FetchIdentity(ctx, m.client, t.BaseURL, m.cfg.IdentityPath, t.Header, m.cfg.Timeout)
		return idResult{id, err}
	})
	if ctx.Err() != nil {
		return // stopping: a canceled fetch says nothing about the engine
	}
	now := time.Now()
	m.mu.Lock()
	for i, t := range ts {
		r := m.reps[t.Key]
		if r == nil {
			continue
		}
		m.applyIdentity(r, res[i], now)
	}
	m.publishLocked()
	m.mu.Unlock()
	if m.cfg.OnChange != nil {
		m.cfg.OnChange()
	}
}

// applyIdentity records one identity answer: admission, and with the
// quarantine on, the instance's commitment (fenced, or rearmed).
func (m *Monitor) applyIdentity(r *replica, res idResult, now time.Time) {
	r.checked = now
	reason := ReasonNone
	if res.err != nil {
		reason = ReasonOf(res.err)
	} else {
		reason = m.cfg.Pins.Check(res.id)
	}
	if reason == ReasonNone {
		r.ok++
	} else {
		r.fail++
	}
	if reason != r.reason {
		m.cfg.Logger.Info("integrity admission changed", zap.String("replica_reason_was", string(r.reason)),
			zap.String("reason", string(reason)), zap.Bool("admitted", reason == ReasonNone))
	}
	prev := r.id
	r.reason = reason
	if reason != ReasonNone {
		return // not attested: nothing is learned about the instance
	}
	r.id = res.id
	if prev != res.id && r.win != nil {
		r.win.Reset() // another instance: its counters start a new chain
		r.observed = false
	}
	if !m.enforce() {
		return
	}
	sc := m.cfg.Spec
	c := Commitment(sc.Key, res.id, r.t.Rank)
	switch {
	case sc.Store.Has(c):
		if !r.quarantined || r.qCommit != c {
			m.cfg.Logger.Warn("integrity: engine instance is fenced by the state file")
		}
		if !r.quarantined {
			r.fenced = true
		}
		r.quarantined, r.qCommit, r.durable = true, c, true
	case r.quarantined && r.qCommit != "" && r.qCommit != c:
		m.cfg.Logger.Info("integrity: a different attested engine instance appeared; quarantine lifted")
		r.quarantined, r.qCommit, r.durable, r.fenced = false, "", false, false
		r.win.Reset()
	}
}

type specResult struct {
	c   SpecCounters
	err error
}

func (m *Monitor) scrapeSpec(ctx context.Context) {
	ts := m.targets(false)
	res := parallel(ts, func(t Target) specResult {
		c, err := m.src.Spec(ctx, t)
		return specResult{c, err}
	})
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	for i, t := range ts {
		r := m.reps[t.Key]
		if r == nil {
			continue
		}
		m.applySpec(r, res[i])
	}
	m.publishLocked()
	m.mu.Unlock()
	if m.cfg.OnChange != nil {
		m.cfg.OnChange()
	}
}

// applySpec feeds one scrape to the replica's window and acts on a
// collapse. The commitment is made durable before the quarantine takes
// effect; when the write fails the replica is held out all the same (fail
// closed) and the write is retried every window.
func (m *Monitor) applySpec(r *replica, res specResult) {
	sc := m.cfg.Spec
	if r.quarantined && !r.durable && r.qCommit != "" {
		m.commit(r)
	}
	if res.err != nil {
		r.win.Break()
		return
	}
	collapsed := r.win.Observe(res.c)
	if sc.Mode == ModeObserve {
		if collapsed != r.observed {
			m.cfg.Logger.Warn("integrity: speculative acceptance collapse (observe mode)",
				zap.Bool("collapsed", collapsed), zap.Int("windows", r.win.Streak()))
		}
		r.observed = collapsed
		return
	}
	if !collapsed || r.quarantined || r.reason != ReasonNone {
		// Not attested: the replica is out already; the streak stays, so
		// the first window after it attests again decides.
		return
	}
	r.qCommit = Commitment(sc.Key, r.id, r.t.Rank)
	m.commit(r)
	r.quarantined = true
	m.cfg.Logger.Warn("integrity: speculative acceptance collapsed; replica quarantined",
		zap.Int("windows", r.win.Streak()), zap.Bool("durable", r.durable))
}

func (m *Monitor) commit(r *replica) {
	if err := m.cfg.Spec.Store.Add(r.qCommit); err != nil {
		m.writes[1]++
		m.cfg.Logger.Error("integrity: writing the quarantine commitment", zap.Error(err))
		r.durable = false
		return
	}
	m.writes[0]++
	r.durable = true
}

// publishLocked recomputes every Out and reports whether any changed.
func (m *Monitor) publishLocked() bool {
	changed := false
	for k, r := range m.reps {
		o := m.outLocked(r)
		if m.out[k] != o {
			m.out[k] = o
			changed = true
		}
	}
	return changed
}
