package integrity

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/selection"
)

// Service is one fleet's integrity checks as the router reads them: the
// Monitor built from Settings, and the per-slot verdict the request path
// reads without a lock. Slots come from lookup (the fleet's
// selection.Router.Lookup). Start it once; Close stops the checks.
type Service struct {
	mon    *Monitor
	lookup func(key string) (selection.Slot, bool)
	scheme string
	header http.Header

	// out[slot]: integrity holds the replica out.
	out [selection.MaxReplicas]atomic.Bool

	mu    sync.Mutex
	known map[string]bool // replica keys added to the monitor
}

// NewService builds the checks of s (Defaults and Validate have run).
// store holds enforce mode's commitments (nil otherwise); it is shared,
// and the caller closes it.
func NewService(s Settings, store *Store, lookup func(string) (selection.Slot, bool), logger *zap.Logger) (*Service, error) {
	g := &Service{lookup: lookup, scheme: s.Scheme, known: map[string]bool{}}
	if s.Token != "" {
		g.header = http.Header{"Authorization": {"Bearer " + s.Token}}
	}
	timeout := time.Duration(s.Timeout)
	client := &http.Client{Timeout: 2 * timeout}
	cfg := Config{Pins: s.Pins, IdentityPath: s.IdentityPath, Interval: time.Duration(s.Interval),
		Timeout: timeout, Client: client, Logger: logger, OnChange: g.Refresh}
	if sd := s.Spec; sd != nil {
		sc := &SpecConfig{Window: time.Duration(sd.Window), WindowConfig: WindowConfig{Windows: sd.Windows, Position: -1},
			Source: &MetricsSource{Client: client, Path: sd.MetricsPath, Timeout: timeout}}
		if sd.Position != nil {
			sc.Position = *sd.Position
		}
		if sd.Mode == "enforce" {
			sc.Mode, sc.Key, sc.Store = ModeEnforce, sd.Key, store
			if store != nil && store.Dirty() && logger != nil {
				logger.Warn("integrity state file had an unresolved dirty marker: its engine instances start fenced")
			}
		}
		cfg.Spec = sc
	}
	mon, err := NewMonitor(cfg)
	if err != nil {
		return nil, err
	}
	g.mon = mon
	return g, nil
}

// Start starts the checks. They outlive any request or config: they stop
// in Close.
func (g *Service) Start() { g.mon.Start(context.Background()) }

// Close stops the checks.
func (g *Service) Close() error { return g.mon.Close() }

// Monitor returns the checks' monitor.
func (g *Service) Monitor() *Monitor { return g.mon }

// Refresh publishes the monitor's verdicts to the per-slot flags.
func (g *Service) Refresh() {
	for _, st := range g.mon.Statuses() {
		if s, ok := g.lookup(st.Key); ok && int(s) < len(g.out) {
			g.out[s].Store(st.Out)
		}
	}
}

// Track starts checking the replica key (dial address, data-parallel
// rank or -1) unless it is checked already.
func (g *Service) Track(key, dial string, rank int) {
	g.mu.Lock()
	added := !g.known[key]
	g.known[key] = true
	g.mu.Unlock()
	if added {
		g.mon.Add(Target{Key: key, BaseURL: g.scheme + "://" + dial, Rank: rank, Header: g.header})
	}
	// Also for a replica /health named before the policy registered its
	// slot: the flag is set before the slot is first routed.
	if s, ok := g.lookup(key); ok && int(s) < len(g.out) {
		g.out[s].Store(g.mon.Out(key))
	}
}

// Out reports whether integrity holds the replica in slot out; on a nil
// Service it is false.
func (g *Service) Out(slot selection.Slot) bool {
	return g != nil && slot >= 0 && int(slot) < selection.MaxReplicas && g.out[slot].Load()
}

// Status returns the replica's state. A replica key not checked yet (one
// /health names before the policy saw it) is tracked from then on.
func (g *Service) Status(key string) Status {
	st, ok := g.mon.Status(key)
	if !ok {
		dial, rank := splitReplicaKey(key)
		g.Track(key, dial, rank)
		st, _ = g.mon.Status(key)
	}
	return st
}

// splitReplicaKey inverts selection.ReplicaKey.
func splitReplicaKey(key string) (string, int) {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == '#' {
			if n, err := strconv.Atoi(key[i+1:]); err == nil {
				return key[:i], n
			}
			break
		}
	}
	return key, -1
}
