package fleetstate

import "github.com/ramjet-llm/ramjet/selection"

// Snapshot is the state of one fleet at scrape time.
type Snapshot struct {
	Key            string
	Config         selection.Config
	Replicas       []ReplicaSnapshot
	IndexEntries   int64
	IndexBytes     int64
	IndexBudget    int64
	IndexEvictions uint64
	// IndexLearnsQueued and IndexLearnsInline count the learns taken off
	// the request path by the index's learn queue, and those of queueing
	// size made inline because the queue was full.
	IndexLearnsQueued, IndexLearnsInline uint64
	// OtherInstances: the engines' answers show prompts other ramjet
	// instances placed on the fleet's replicas, and the agreement band is
	// on (selection.Router.Several).
	OtherInstances bool
	// Density: the prompts' bytes per real token the router applies to
	// the engines' figures (selection.Router.Density).
	Density float64
}

// ReplicaSnapshot is one replica at scrape time. It carries the opaque id
// only: never the address.
type ReplicaSnapshot struct {
	ID             string  `json:"id"`
	Slot           int     `json:"slot"`
	Rank           int     `json:"rank"`
	Inflight       int64   `json:"inflight"`
	PendingPrefill int64   `json:"pending_prefill_tokens"`
	Load           float64 `json:"load_tokens"`
	Known          bool    `json:"known"`
	Healthy        bool    `json:"healthy"`
	Available      bool    `json:"available"`
	Quarantined    bool    `json:"quarantined"`
	Fails          int     `json:"fails"`
	Profile        string  `json:"profile"`
	// Ejected: outlier detection holds the replica out; Ejections counts
	// its ejections by selection.FailureKinds.
	Ejected   bool                                `json:"ejected"`
	Ejections [len(selection.FailureKinds)]uint64 `json:"-"`
	// Integrity is the engine-integrity state, when configured; an
	// upstream it holds out is not Available.
	Integrity *IntegrityReport `json:"integrity,omitempty"`
}

// Snapshot reads the fleet: its Router's index and load, and reps (from
// Replicas, with the health the upstream pools report filled in).
func (f *Fleet) Snapshot(reps []Replica) Snapshot {
	rt := f.Router()
	idx := rt.Index()
	cfg := rt.Config()
	fs := Snapshot{Key: f.StateKey, Config: cfg, IndexEntries: idx.Entries(),
		IndexBytes: idx.Bytes(), IndexBudget: idx.Budget(), IndexEvictions: idx.Evictions()}
	fs.IndexLearnsQueued, fs.IndexLearnsInline = idx.QueuedLearns()
	fs.OtherInstances, fs.Density = rt.Several(), rt.Density()
	od := f.Detector()
	for _, r := range reps {
		if r.Key == "" {
			continue // a slot freed by Unregister: its replica left
		}
		var ej [len(selection.FailureKinds)]uint64
		for i, k := range selection.FailureKinds {
			ej[i] = od.Ejections(r.Slot, k)
		}
		fs.Replicas = append(fs.Replicas, ReplicaSnapshot{
			Ejected: od.Ejected(r.Slot), Ejections: ej,
			ID: r.ID, Slot: int(r.Slot), Rank: r.Rank,
			Inflight: r.Inflight, PendingPrefill: r.PendingPrefill,
			Load:        float64(r.Inflight*int64(cfg.RequestCost) + r.PendingPrefill),
			Known:       r.Known,
			Healthy:     r.Known && r.Healthy,
			Available:   r.Known && r.Available && (r.Integrity == nil || !r.Integrity.Out),
			Integrity:   r.Integrity,
			Quarantined: r.Known && !r.Healthy && r.Fails > 0,
			Fails:       r.Fails,
			Profile:     ProfileName(r.Profile),
		})
	}
	return fs
}

// ProfileName is the name of an engine profile in snapshots.
func ProfileName(p selection.Profile) string {
	if p == selection.ProfileSpeculative {
		return "speculative"
	}
	return "standard"
}

// State is the answer of GET /ramjet/fleet for one fleet.
type State struct {
	Fleet    string            `json:"fleet"`
	Config   selection.Config  `json:"config"`
	Index    IndexState        `json:"index"`
	Replicas []ReplicaSnapshot `json:"replicas"`
	// Engines are the replicas' engine-reported states when the policy's
	// engine_metrics is on (module/engines.go).
	Engines []EngineState `json:"engines,omitempty"`
}

// IndexState is the approximate index's size against its budget.
type IndexState struct {
	Entries     int64   `json:"entries"`
	Bytes       int64   `json:"bytes"`
	BudgetBytes int64   `json:"budget_bytes"`
	Evictions   uint64  `json:"evictions"`
	Used        float64 `json:"used"` // bytes / budget
}

// State is the admin API's view of s.
func (s Snapshot) State() State {
	used := 0.0
	if s.IndexBudget > 0 {
		used = float64(s.IndexBytes) / float64(s.IndexBudget)
	}
	reps := s.Replicas
	if reps == nil {
		reps = []ReplicaSnapshot{}
	}
	return State{Fleet: s.Key, Config: s.Config, Replicas: reps, Index: IndexState{
		Entries: s.IndexEntries, Bytes: s.IndexBytes, BudgetBytes: s.IndexBudget,
		Evictions: s.IndexEvictions, Used: used}}
}
