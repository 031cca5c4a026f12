package module

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
)

// integStates holds the integrity state across config reloads, keyed by
// the fleet and the integrity configuration.
var integStates = caddy.NewUsagePool()

// integState is one fleet's integrity service (integrity.Service) kept in
// the integStates pool.
type integState struct {
	*integrity.Service
	release func() // drops the shared state file store; nil without one
	f       *fleet
}

// Destruct stops the checks: the last policy using them was cleaned up.
func (g *integState) Destruct() error {
	integLive.Drop(g.f.PoolKey, g)
	err := g.Close()
	if g.release != nil {
		g.release()
	}
	return err
}

// integLive maps each live fleet (by pool key) to its integrity state, for
// /health, /ramjet/fleet and the metrics.
var integLive fleetstate.Latest[*integState]

func integrityOf(f *fleet) *integState {
	if f == nil {
		return nil
	}
	g, _ := integLive.Get(f.PoolKey)
	return g
}

// integCollector exports the integrity and session shadow series of every
// live fleet; created once, registered into every config's registry.
var integCollector = sync.OnceValue(func() *metrics.IntegrityCollector {
	return metrics.NewIntegrityCollector(func() []metrics.IntegritySource {
		gs := integLive.Values()
		out := make([]metrics.IntegritySource, len(gs))
		for i, g := range gs {
			out[i] = metrics.IntegritySource{Fleet: g.f.StateKey, Monitor: g.Monitor(), RouteID: g.f.RouteID}
		}
		return out
	}, func() []metrics.ShadowSource {
		ss := shadowLive.Values()
		out := make([]metrics.ShadowSource, len(ss))
		for i, sh := range ss {
			out[i] = metrics.ShadowSource{Fleet: sh.f.StateKey, Shadow: sh.ss}
		}
		return out
	})
})

func (s *RamjetSelection) provisionIntegrity(ctx caddy.Context) error {
	if s.Integrity == nil {
		return nil
	}
	set := s.Integrity.Resolved(resolveSecret)
	if err := set.Validate(); err != nil {
		return err
	}
	if err := register(ctx.GetMetricsRegistry(), integCollector()); err != nil {
		return fmt.Errorf("integrity metrics: %w", err)
	}
	// Keyed by the settings and the resolved secrets (shared while both
	// stay the same).
	key := fmt.Sprintf("ramjet-integrity/%s/%016x", s.poolKey, set.Fingerprint())
	logger := s.logger.Named("integrity")
	f := s.fleet
	v, _, err := integStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		g := &integState{f: f}
		var store *integrity.Store
		if set.Enforce() {
			st, release, err := integrity.AcquireStore(set.Spec.StateFile, set.Spec.Key)
			if err != nil {
				return nil, err
			}
			store, g.release = st, release
		}
		svc, err := integrity.NewService(set, store, f.Base().Lookup, logger)
		if err != nil {
			if g.release != nil {
				g.release()
			}
			return nil, err
		}
		g.Service = svc
		// The checks outlive this config (a reload keeps them): they stop
		// in Destruct.
		svc.Start()
		return g, nil
	})
	if err != nil {
		return fmt.Errorf("integrity: %w", err)
	}
	s.integ, s.integKey = v.(*integState), key
	integLive.Set(f.PoolKey, s.integ)
	return nil
}

func (s *RamjetSelection) cleanupIntegrity() error {
	if s.integ == nil {
		return nil
	}
	s.integ = nil
	_, err := integStates.Delete(s.integKey)
	return err
}

// bindIntegrity starts checking the replicas of a new pool view.
func (s *RamjetSelection) bindIntegrity(v *poolView) {
	if s.integ == nil {
		return
	}
	for i, key := range v.Keys {
		if v.Slots[i] >= 0 {
			s.integ.Track(key, v.pool[i].Dial, v.Ranks[i])
		}
	}
}

// integrityOut reports whether integrity holds the replica in slot out.
// Without integrity configured it is one nil check.
func (s *RamjetSelection) integrityOut(slot selection.Slot) bool {
	return s.integ != nil && s.integ.Out(slot)
}

// integrityPool is pool (a sub-pool of v's) without the replicas integrity
// holds out; nil when none is left (fail closed). Without integrity it is
// pool itself.
func (s *RamjetSelection) integrityPool(pool reverseproxy.UpstreamPool, v *poolView) reverseproxy.UpstreamPool {
	if s.integ == nil {
		return pool
	}
	var sub reverseproxy.UpstreamPool
	for _, up := range pool {
		for j, vu := range v.pool {
			if vu == up {
				if !s.integrityOut(v.Slots[j]) {
					sub = append(sub, up)
				}
				break
			}
		}
	}
	return sub
}

// integrityStatus returns the replica's integrity state, nil when the
// fleet runs without integrity. A replica /health names before the policy
// saw it is tracked from then on.
func integrityStatus(f *fleet, key string) *fleetstate.IntegrityReport {
	g := integrityOf(f)
	if g == nil {
		return nil
	}
	return fleetstate.NewIntegrityReport(g.Status(key))
}

// shadowState is one fleet's session shadow, kept across reloads.
type shadowState struct {
	ss     *integrity.SessionShadow
	header string
	f      *fleet
}

func (*shadowState) Destruct() error { return nil }

var (
	shadowStates = caddy.NewUsagePool()
	shadowLive   fleetstate.Latest[*shadowState] // by the fleet's pool key
)

func (s *RamjetSelection) provisionShadow(ctx caddy.Context) error {
	c := s.SessionShadow
	if c == nil {
		return nil
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	if err := register(ctx.GetMetricsRegistry(), integCollector()); err != nil {
		return fmt.Errorf("session shadow metrics: %w", err)
	}
	key := fmt.Sprintf("ramjet-shadow/%s/%s/%d", s.poolKey, c.Header, c.MaxSessions)
	f := s.fleet
	v, _, err := shadowStates.LoadOrNew(key, func() (caddy.Destructor, error) {
		return &shadowState{ss: integrity.NewSessionShadow(c.MaxSessions), header: http.CanonicalHeaderKey(c.Header), f: f}, nil
	})
	if err != nil {
		return err
	}
	s.shadow, s.shadowKey = v.(*shadowState), key
	shadowLive.Set(f.PoolKey, s.shadow)
	return nil
}

func (s *RamjetSelection) cleanupShadow() error {
	if s.shadow == nil {
		return nil
	}
	sh := s.shadow
	s.shadow = nil
	deleted, err := shadowStates.Delete(s.shadowKey)
	if deleted {
		shadowLive.Drop(sh.f.PoolKey, sh)
	}
	return err
}

// observeShadow records the session-sticky policy's choice for a routed
// request (after the decision: it can change nothing). On a disagreement
// it scores the sticky replica with a read-only Pick.
func (s *RamjetSelection) observeShadow(r *http.Request, pool reverseproxy.UpstreamPool, v *poolView, feat *selection.Features, d selection.Decision) {
	sh := s.shadow
	if sh == nil || d.Index < 0 {
		return
	}
	vals := r.Header[sh.header]
	if len(vals) == 0 || vals[0] == "" {
		return
	}
	od := s.fleet.Detector()
	index := func(slot int) int {
		for i, sl := range v.Slots {
			if int(sl) == slot {
				return i
			}
		}
		return -1
	}
	usable := func(slot int) bool {
		i := index(slot)
		return i >= 0 && pool[i].Available() && !s.integrityOut(v.Slots[i]) && od.Usable(v.Slots[i])
	}
	out, sticky := sh.ss.Record(xxhash.Sum64String(vals[0]), int(d.Slot), usable)
	integCollector().Shadow.Decisions.WithLabelValues(s.fleet.StateKey, out.String()).Inc()
	if out != integrity.ShadowDisagree {
		return
	}
	if j := index(sticky); j >= 0 {
		s.scoreSticky(len(pool), v, feat, d, j)
	}
}

// scoreSticky scores the sticky replica, candidate j of the pool, with a
// read-only Pick and records the disagreement. Not inlined: its Scratch
// lives on its stack (4.6 KB), and in observeShadow's frame it made every
// Select that reached it grow the goroutine's stack after each GC had
// shrunk it, shadow on or off.
//
//go:noinline
func (s *RamjetSelection) scoreSticky(n int, v *poolView, feat *selection.Features, d selection.Decision, j int) {
	cands := make([]selection.Candidate, n)
	for i := range cands {
		cands[i] = selection.Candidate{Slot: v.Slots[i], Usable: i == j, Profile: v.Profiles[i]}
	}
	sc := selection.NewScratch(n)
	s.rt.Pick(feat, cands, sc)
	integCollector().Shadow.Disagree(s.fleet.StateKey, d.Overlap, sc.Overlap[j], d.Load, sc.Load[j])
}

// explainSession is the session part of an explanation of r (nil without
// a session shadow or a session header).
func explainSession(f *fleet, r *http.Request, decided string) *fleetstate.ExplainSession {
	sh, ok := shadowLive.Get(f.PoolKey)
	if !ok {
		return nil
	}
	key := r.Header.Get(sh.header)
	if key == "" {
		return nil
	}
	return fleetstate.NewExplainSession(sh.ss, key, f.SlotID, decided)
}
