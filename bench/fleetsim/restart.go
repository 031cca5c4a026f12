package fleetsim

import (
	"fmt"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/selection"
	"github.com/ramjet-llm/ramjet/snapshot"
)

// Restart is ramjet (NewRamjet) whose process restarts at simulated time
// At, while the engines keep running with their prefix caches: from the
// first decision at or after At on, a fresh Router routes. It starts cold
// or, with Snapshot, from the snapshot the old process wrote at its clean
// shutdown, through the module's path without the files:
// Router.ExportIndex, snapshot.Encode, snapshot.Decode, Snapshot.Beliefs
// and Router.ImportIndex. Requests in flight at the restart end on the
// old Router.
type Restart struct {
	At       time.Duration
	Snapshot bool

	cfg   selection.Config
	cur   *Ramjet
	owner map[int]*Ramjet // by request ID, until Done
	now   time.Duration
	label string

	// Restarted is when the restart happened (the first decision at or
	// after At), -1 before.
	Restarted time.Duration
	// SnapshotBytes is the size of the snapshot handed over.
	SnapshotBytes int
}

// NewRestart returns a restarting ramjet policy with cfg.
func NewRestart(cfg selection.Config, at time.Duration, withSnapshot bool) (*Restart, error) {
	p, err := NewRamjet(cfg)
	if err != nil {
		return nil, err
	}
	label := "ramjet-restart-cold"
	if withSnapshot {
		label = "ramjet-restart-snapshot"
	}
	return &Restart{At: at, Snapshot: withSnapshot, cfg: cfg, cur: p, owner: map[int]*Ramjet{}, label: label, Restarted: -1}, nil
}

var restartKey = []byte("fleetsim-snapshot-key")

func (p *Restart) restart(fleet []*Replica) error {
	old := p.cur
	nr, err := NewRamjet(p.cfg)
	if err != nil {
		return err
	}
	if err := nr.ensure(fleet); err != nil {
		return err
	}
	if p.Snapshot {
		s := &snapshot.Snapshot{Shape: snapshot.ShapeOf(nr.rt.Config()), Written: simEpoch.Add(p.now),
			Replicas: snapshot.FromBeliefs(restartKey, old.rt.ExportIndex(0))}
		b := snapshot.Encode(s)
		p.SnapshotBytes = len(b)
		got, err := snapshot.Decode(b)
		if err != nil {
			return fmt.Errorf("restart snapshot: %w", err)
		}
		keys := make([]string, len(fleet))
		for i := range keys {
			keys[i] = replicaKey(i)
		}
		bs, _ := got.Beliefs(restartKey, keys)
		nr.rt.ImportIndex(bs)
	}
	p.cur, p.Restarted = nr, p.now
	return nil
}

func (p *Restart) Name() string { return p.label }

func (p *Restart) Pick(r *Request, fleet []*Replica) int {
	if p.Restarted < 0 && p.now >= p.At {
		if err := p.restart(fleet); err != nil {
			panic(err) // a snapshot of this process's own index decodes
		}
	}
	p.owner[r.Row.ID] = p.cur
	return p.cur.Pick(r, fleet)
}

func (p *Restart) Routed(r *Request, rep int) {
	if o := p.owner[r.Row.ID]; o != nil {
		o.Routed(r, rep)
	}
}

func (p *Restart) FirstToken(r *Request, rep int) {
	if o := p.owner[r.Row.ID]; o != nil {
		o.FirstToken(r, rep)
	}
}

func (p *Restart) Observe(r *Request, rep int, u engine.Usage) {
	if o := p.owner[r.Row.ID]; o != nil {
		o.Observe(r, rep, u)
	}
}

func (p *Restart) Done(r *Request, rep int) {
	if o := p.owner[r.Row.ID]; o != nil {
		o.Done(r, rep)
		delete(p.owner, r.Row.ID)
	}
}

// ScrapeEngines keeps the simulated time (Run calls it before every
// event) and hands the scrape to the routing process.
func (p *Restart) ScrapeEngines(now time.Duration, fleet []*Replica) {
	p.now = now
	p.cur.ScrapeEngines(now, fleet)
}

var (
	_ usageObserver = (*Restart)(nil)
	_ engineScraper = (*Restart)(nil)
)

// CachedShare is the share of prompt tokens the engines served from their
// prefix cache, over the requests of res sent in [from, to) seconds, and
// how many requests that was.
func CachedShare(res *Result, from, to float64) (share float64, n int) {
	var prompt, cached int
	for _, r := range res.Records {
		if r.Err != "" || r.Sent < from || r.Sent >= to {
			continue
		}
		prompt += r.Prompt
		cached += r.Cached
		n++
	}
	if prompt == 0 {
		return 0, n
	}
	return float64(cached) / float64(prompt), n
}

// SpreadOf is the median, minimum and maximum of xs (NaN for none).
func SpreadOf(xs []float64) Spread { return spreadOf(xs) }
