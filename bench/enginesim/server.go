package enginesim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// errRestarted fails requests that were in flight when the engine
// restarted.
var errRestarted = errors.New("engine restarted")

// Recorded is one request as the simulator received it.
type Recorded struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	// Rank is the data-parallel rank it was routed to (-1 when its
	// X-data-parallel-rank header was invalid). Requests are recorded
	// before faults and validation, so failed requests are recorded too.
	Rank int
	At   time.Time
}

// RankStats are one data-parallel rank's counters.
type RankStats struct {
	Rank int
	// Requests is the number of valid requests submitted to this rank.
	Requests uint64
	// Engine is the engine's state and counters.
	Engine engine.Stats
	// KVBatches is the number of KV event batches published since the
	// last restart (the next sequence number).
	KVBatches uint64
}

// Server is a running simulator. Its methods are safe for concurrent use.
type Server struct {
	opts    Options
	ctx     context.Context
	cancel  context.CancelFunc
	srv     *http.Server
	admin   *http.Server
	adminLn net.Listener
	reg     *prometheus.Registry
	ttft    *prometheus.HistogramVec
	e2e     *prometheus.HistogramVec
	ranks   []*rank
	wg      sync.WaitGroup
	ids     atomic.Uint64
	rr      atomic.Uint64
	ident   identityState // identity.go

	mu      sync.Mutex // guards the fields below
	addr    string
	ln      net.Listener
	release func() error // holds addr's port while connections are refused
	faults  Faults
	rng     *rand.Rand
	last    *Recorded
	closed  bool
	serving sync.WaitGroup

	connMu sync.Mutex                  // guards conns
	conns  map[net.Conn]http.ConnState // the main listener's open connections (trackConn)
}

// pending is one request inside a rank, guarded by rank.mu.
type pending struct {
	generated int
	firstAt   time.Duration
	done      bool
	usage     engine.Usage
	err       error
	notify    chan struct{}
}

func (p *pending) signal() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

type rank struct {
	s     *Server
	idx   int
	wake  chan struct{}
	pub   *kvPublisher
	count atomic.Uint64

	pubMu sync.Mutex // serialises draining and publishing KV batches

	mu      sync.Mutex // guards the fields below
	eng     *engine.Engine
	epoch   time.Time
	reqs    map[uint64]*pending
	evs     []engine.Event
	kvBatch []engine.KVEvent
	kvAt    time.Time // when kvBatch's first event was stored: the batch's ts
	last    *Recorded
}

// Start starts a simulator: its HTTP server, one engine loop per rank and
// the KV event publishers. Close stops all of it; ctx only bounds startup.
func Start(ctx context.Context, o Options) (*Server, error) {
	o.setDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		opts: o, ctx: sctx, cancel: cancel,
		reg:    prometheus.NewRegistry(),
		addr:   ln.Addr().String(),
		ln:     ln,
		faults: o.Faults,
		rng:    rand.New(rand.NewPCG(o.Seed, 0xfa17)),
	}
	s.initMetrics()
	s.initIdentity()
	for i := 0; i < o.DP; i++ {
		r := &rank{s: s, idx: i, wake: make(chan struct{}, 1), reqs: make(map[uint64]*pending)}
		if o.KVEvents.Endpoint != "" {
			r.pub, err = newKVPublisher(sctx, o.KVEvents, i)
			if err != nil {
				ln.Close()
				cancel()
				for _, r := range s.ranks {
					r.pub.close()
				}
				return nil, err
			}
		}
		r.reset()
		s.ranks = append(s.ranks, r)
	}
	s.applyFaults(o.Faults)
	s.srv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second, ConnState: s.trackConn}
	for _, r := range s.ranks {
		s.wg.Add(1)
		go r.run()
	}
	if o.AdminAddr != "" {
		aln, err := lc.Listen(ctx, "tcp", o.AdminAddr)
		if err != nil {
			ln.Close()
			s.Close()
			return nil, fmt.Errorf("admin listen: %w", err)
		}
		mux := http.NewServeMux()
		s.adminRoutes(mux)
		s.admin = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		s.adminLn = aln
		s.serving.Add(1)
		go func() {
			defer s.serving.Done()
			_ = s.admin.Serve(aln)
		}()
	}
	s.serve(ln)
	return s, nil
}

// AdminURL is the base URL of the admin listener, or "" without one.
func (s *Server) AdminURL() string {
	if s.adminLn == nil {
		return ""
	}
	return "http://" + s.adminLn.Addr().String()
}

func (s *Server) serve(ln net.Listener) {
	s.serving.Add(1)
	go func() {
		defer s.serving.Done()
		_ = s.srv.Serve(ln)
	}()
}

// URL is the base URL, e.g. "http://127.0.0.1:41234" (append /v1 for
// OpenAI clients).
func (s *Server) URL() string { return "http://" + s.Addr() }

// Addr is the listen address host:port.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Model is the served model name.
func (s *Server) Model() string { return s.opts.Model }

// Options returns the options with defaults filled.
func (s *Server) Options() Options { return s.opts }

// tok is the simulator's tokenizer stand-in (Options.Density).
func (s *Server) tok() engine.Tokenizer { return engine.Tokenizer{Density: s.opts.Density} }

// KVEndpoints are the ranks' bound PUB addresses (tcp://host:port), in
// rank order; nil when events are off.
func (s *Server) KVEndpoints() []string {
	var eps []string
	for _, r := range s.ranks {
		if r.pub != nil {
			eps = append(eps, r.pub.Endpoint())
		}
	}
	return eps
}

// KVReplayEndpoints are the ranks' bound ROUTER addresses; nil when off.
func (s *Server) KVReplayEndpoints() []string {
	var eps []string
	for _, r := range s.ranks {
		if r.pub != nil && r.pub.router != nil {
			eps = append(eps, r.pub.ReplayEndpoint())
		}
	}
	return eps
}

// Registry is the simulator's private Prometheus registry (served at
// /metrics).
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Close stops the server, fails in-flight requests and waits for every
// goroutine it started.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.release != nil {
		s.release()
		s.release = nil
	}
	s.mu.Unlock()
	s.cancel()
	err := s.srv.Close()
	if s.admin != nil {
		s.admin.Close()
	}
	s.serving.Wait()
	s.wg.Wait()
	for _, r := range s.ranks {
		if r.pub != nil {
			r.pub.close()
		}
	}
	return err
}

// Faults returns the current faults.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// trackConn is the main server's ConnState hook: it keeps the open
// connections and their states for closeUnused.
func (s *Server) trackConn(c net.Conn, st http.ConnState) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	switch st {
	case http.StateHijacked, http.StateClosed:
		delete(s.conns, c)
	default:
		if s.conns == nil {
			s.conns = map[net.Conn]http.ConnState{}
		}
		s.conns[c] = st
	}
}

// closeUnused closes every connection that carries no request now: the
// idle ones (SetKeepAlivesEnabled closes those too) and the new ones that
// never carried one. net/http leaves a new connection open for its first
// 5 s, and a client's transport can hold one in its idle pool (a dial it
// started for a request that another connection served first): without
// this a refusing engine still answered the next request sent on it.
func (s *Server) closeUnused() {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	for c, st := range s.conns {
		if st == http.StateNew || st == http.StateIdle {
			c.Close()
		}
	}
}

// refuseGrace is how long SetFaults waits after closing idle connections
// when it starts refusing, so that clients' connection pools see the
// closes before their next request (otherwise a client may write into a
// pooled connection the server just closed and get a reset instead of a
// refused dial).
const refuseGrace = 25 * time.Millisecond

// SetFaults replaces the current faults. When it starts refusing
// connections it closes the listener and every idle connection and returns
// after a short grace period.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	refusing := s.Faults().RefuseConnections
	if err := s.applyFaults(f); err != nil {
		return err
	}
	if f.RefuseConnections && !refusing {
		time.Sleep(refuseGrace)
	}
	return nil
}

func (s *Server) applyFaults(f Faults) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("server closed")
	}
	old := s.faults
	s.faults = f
	switch {
	case f.RefuseConnections && s.ln != nil:
		s.srv.SetKeepAlivesEnabled(false) // also closes idle connections
		s.ln.Close()
		s.closeUnused()
		s.ln = nil
		release, err := holdPort(s.addr)
		if err != nil {
			return err
		}
		s.release = release
	case !f.RefuseConnections && s.ln == nil:
		if s.release != nil {
			s.release()
			s.release = nil
		}
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			s.faults = old
			return fmt.Errorf("relisten %s: %w", s.addr, err)
		}
		s.ln = ln
		s.srv.SetKeepAlivesEnabled(true)
		s.serve(ln)
	}
	acc := s.opts.Engine.SpecAcceptance
	if f.SpecAcceptance != nil {
		acc = *f.SpecAcceptance
	}
	for _, r := range s.ranks {
		r.mu.Lock()
		r.eng.SetSpecAcceptance(acc)
		r.mu.Unlock()
	}
	return nil
}

// Restart simulates an engine restart on every rank: in-flight requests
// fail, the prefix cache is empty, the engine counters and the KV event
// sequence start again from zero.
func (s *Server) Restart() {
	f := s.Faults()
	for _, r := range s.ranks {
		r.pubMu.Lock()
		r.mu.Lock()
		for id, p := range r.reqs {
			p.err = errRestarted
			p.signal()
			delete(r.reqs, id)
		}
		r.reset()
		if f.SpecAcceptance != nil {
			r.eng.SetSpecAcceptance(*f.SpecAcceptance)
		}
		r.kvBatch = nil
		if r.pub != nil {
			r.pub.reset()
		}
		r.mu.Unlock()
		r.pubMu.Unlock()
		r.poke()
	}
}

// ResetPrefixCache drops every rank's prefix cache (and in-flight
// requests) and publishes AllBlocksCleared, as vLLM's
// POST /reset_prefix_cache.
func (s *Server) ResetPrefixCache() {
	for _, r := range s.ranks {
		r.mu.Lock()
		r.eng.Reset()
		for id, p := range r.reqs {
			p.err = errRestarted
			p.signal()
			delete(r.reqs, id)
		}
		r.mu.Unlock()
		r.poke()
	}
}

// Stats returns every rank's counters, in rank order.
func (s *Server) Stats() []RankStats {
	out := make([]RankStats, len(s.ranks))
	for i, r := range s.ranks {
		r.mu.Lock()
		out[i] = RankStats{Rank: i, Requests: r.count.Load(), Engine: r.eng.Stats()}
		r.mu.Unlock()
		if r.pub != nil {
			r.pub.mu.Lock()
			out[i].KVBatches = r.pub.seq
			r.pub.mu.Unlock()
		}
	}
	return out
}

// LastRequest returns the last request received on an OpenAI route, and
// false if there was none.
func (s *Server) LastRequest() (Recorded, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return Recorded{}, false
	}
	return *s.last, true
}

// LastRequestAt returns the last request routed to a rank.
func (s *Server) LastRequestAt(rank int) (Recorded, bool) {
	if rank < 0 || rank >= len(s.ranks) {
		return Recorded{}, false
	}
	r := s.ranks[rank]
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		return Recorded{}, false
	}
	return *r.last, true
}

// reset gives the rank a fresh engine (r.mu held or not yet shared).
func (r *rank) reset() {
	r.eng = engine.New(r.s.opts.Engine)
	r.eng.SetKVEventHandler(func(ev engine.KVEvent) {
		if len(r.kvBatch) == 0 {
			r.kvAt = time.Now()
		}
		r.kvBatch = append(r.kvBatch, ev)
	})
	r.epoch = time.Now()
}

func (r *rank) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// simNow is the simulated time now (r.mu held).
func (r *rank) simNow() time.Duration {
	return time.Duration(float64(time.Since(r.epoch)) * r.s.opts.TimeScale)
}

// wallAt is the wall time of simulated time t (r.mu held).
func (r *rank) wallAt(t time.Duration) time.Time {
	return r.epoch.Add(time.Duration(float64(t) / r.s.opts.TimeScale))
}

// instantBatch is how many engine steps an instant rank runs per lock hold.
const instantBatch = 64

// run drives the rank's engine until the server closes.
func (r *rank) run() {
	defer r.s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	instant := r.s.opts.Instant
	for {
		r.pubMu.Lock()
		r.mu.Lock()
		if instant {
			// Up to instantBatch steps per lock hold: handlers waiting for
			// the lock would otherwise hand it over at every step.
			r.evs = r.evs[:0]
			for i := 0; i < instantBatch; i++ {
				t, ok := r.eng.NextEventTime()
				if !ok {
					break
				}
				r.evs = r.eng.AdvanceTo(t, r.evs)
			}
		} else {
			r.evs = r.eng.AdvanceTo(r.simNow(), r.evs[:0])
		}
		r.dispatch(r.evs)
		next, ok := r.eng.NextEventTime()
		var wait time.Duration
		if ok && !instant {
			wait = time.Until(r.wallAt(next))
		}
		batch, at := r.kvBatch, r.kvAt
		r.kvBatch = nil
		r.mu.Unlock()
		if len(batch) > 0 && r.pub != nil {
			// The batch's ts is when its blocks were stored, before
			// dispatch woke their requests' handlers, as vLLM stamps a
			// step's batch before its outputs leave the engine core:
			// stamped here, after the first tokens went out, a stall of
			// this goroutine put it later than them, and a router read
			// its own request's blocks as another instance's prefill
			// (TestE2EForeignOwnRuns under load).
			_ = r.pub.publish(float64(at.UnixNano())/1e9, batch) // a PUB socket drops on error, as vLLM's
		}
		r.pubMu.Unlock()
		if ok && wait <= 0 {
			select {
			case <-r.s.ctx.Done():
				r.failAll()
				return
			default:
				continue
			}
		}
		var tc <-chan time.Time
		if ok {
			timer.Reset(wait)
			tc = timer.C
		}
		select {
		case <-r.s.ctx.Done():
			r.failAll()
			return
		case <-r.wake:
		case <-tc:
		}
	}
}

func (r *rank) failAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, p := range r.reqs {
		p.err = errors.New("server closed")
		p.signal()
		delete(r.reqs, id)
	}
}

// dispatch applies engine events to pending requests (r.mu held).
func (r *rank) dispatch(evs []engine.Event) {
	for _, ev := range evs {
		p, ok := r.reqs[ev.ID]
		if !ok {
			continue
		}
		p.generated = ev.Generated
		p.usage = ev.Usage
		if ev.Kind == engine.EventFirstToken {
			p.firstAt = ev.At
			r.s.ttft.WithLabelValues(r.s.opts.Model, r.label()).Observe((ev.At - ev.Arrival).Seconds())
		}
		if ev.Kind == engine.EventFinished {
			p.done = true
			delete(r.reqs, ev.ID)
			r.s.e2e.WithLabelValues(r.s.opts.Model, r.label()).Observe((ev.At - ev.Arrival).Seconds())
		}
		p.signal()
	}
}

func (r *rank) label() string { return fmt.Sprint(r.idx) }

// submit queues a request on the rank.
func (r *rank) submit(req engine.Request) (*pending, error) {
	p := &pending{notify: make(chan struct{}, 1)}
	r.mu.Lock()
	if !r.s.opts.Instant {
		r.evs = r.eng.AdvanceTo(r.simNow(), r.evs[:0])
		r.dispatch(r.evs)
	}
	err := r.eng.Submit(req)
	if err == nil {
		r.reqs[req.ID] = p
	}
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	r.poke()
	return p, nil
}

// abort removes a request whose client went away.
func (r *rank) abort(id uint64) {
	r.mu.Lock()
	if _, ok := r.reqs[id]; ok {
		r.eng.Abort(id)
		delete(r.reqs, id)
	}
	r.mu.Unlock()
	r.poke()
}

// snapshot copies a pending request's state.
func (r *rank) snapshot(p *pending) pending {
	r.mu.Lock()
	defer r.mu.Unlock()
	return pending{generated: p.generated, firstAt: p.firstAt, done: p.done, usage: p.usage, err: p.err}
}

// pickRank chooses the least loaded rank (waiting x 4 + running, as vLLM's
// DP coordinator weighs them), ties broken round robin.
func (s *Server) pickRank() *rank {
	if len(s.ranks) == 1 {
		return s.ranks[0]
	}
	start := int(s.rr.Add(1))
	var best *rank
	bestLoad := 0
	for i := range s.ranks {
		r := s.ranks[(start+i)%len(s.ranks)]
		r.mu.Lock()
		load := r.eng.Waiting()*4 + r.eng.Running()
		r.mu.Unlock()
		if best == nil || load < bestLoad {
			best, bestLoad = r, load
		}
	}
	return best
}
