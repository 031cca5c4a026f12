package module

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI adds ramjet's routes to Caddy's admin API (module
// admin.api.ramjet; like all of the admin API it listens on localhost
// unless configured otherwise):
//
//	GET  /ramjet/fleet[?fleet=<state_key>]
//	     every replica by opaque id with its load, pending prefill and
//	     health, and the index's size against its budget.
//	POST /ramjet/explain[?fleet=<state_key>][&path=/v1/chat/completions]
//	     body: an OpenAI request body. The score of every replica (overlap,
//	     capped overlap, load, score) and the decision the policy would
//	     make now, with the rule that decided a tie. Nothing is sent,
//	     reserved or learned.
//	GET  /ramjet/dashboard/data
//	     the dashboard's JSON (see the ramjet_dashboard handler).
//
// Caddy loads every admin.api module with each config, so the module needs
// no configuration; it also registers the ramjet_* metrics into the
// config's registry, which the admin API serves at /metrics.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.ramjet",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Provision registers the ramjet metrics into the config's registry.
func (a *AdminAPI) Provision(ctx caddy.Context) error {
	return registerMetrics(ctx.GetMetricsRegistry())
}

// Routes returns the admin routes.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/ramjet/fleet", Handler: caddy.AdminHandlerFunc(a.handleFleet)},
		{Pattern: "/ramjet/explain", Handler: caddy.AdminHandlerFunc(a.handleExplain)},
		{Pattern: "/ramjet/dashboard/data", Handler: caddy.AdminHandlerFunc(a.handleDashboardData)},
	}
}

// maxExplainBody bounds the body POST /ramjet/explain reads.
const maxExplainBody = DefaultMaxBodyBytes

// FleetState is the answer of GET /ramjet/fleet for one fleet.
type FleetState struct {
	Fleet    string            `json:"fleet"`
	Config   selection.Config  `json:"config"`
	Index    IndexState        `json:"index"`
	Replicas []replicaSnapshot `json:"replicas"`
	// Engines are the replicas' engine-reported states when the policy's
	// engine_metrics is on (engines.go).
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

func fleetState(s fleetSnapshot) FleetState {
	used := 0.0
	if s.IndexBudget > 0 {
		used = float64(s.IndexBytes) / float64(s.IndexBudget)
	}
	reps := s.Replicas
	if reps == nil {
		reps = []replicaSnapshot{}
	}
	return FleetState{Fleet: s.Key, Config: s.Config, Replicas: reps, Index: IndexState{
		Entries: s.IndexEntries, Bytes: s.IndexBytes, BudgetBytes: s.IndexBudget,
		Evictions: s.IndexEvictions, Used: used}, Engines: engineStatesOf(s.Key)}
}

func (a *AdminAPI) handleFleet(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	want := r.URL.Query().Get("fleet")
	out := struct {
		Fleets []FleetState `json:"fleets"`
	}{Fleets: []FleetState{}}
	for _, s := range snapshotFleets() {
		if want == "" || want == s.Key {
			out.Fleets = append(out.Fleets, fleetState(s))
		}
	}
	if want != "" && len(out.Fleets) == 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no live fleet %q", want)}
	}
	return writeAdminJSON(w, out)
}

// Explanation is the answer of POST /ramjet/explain.
type Explanation struct {
	Fleet    string `json:"fleet"`
	Endpoint string `json:"endpoint"`
	// PromptTokens is the estimated prompt length; Blocks the number of
	// fingerprinted blocks (Truncated: the prompt was longer than
	// prefix_tokens).
	PromptTokens int  `json:"prompt_tokens"`
	Blocks       int  `json:"blocks"`
	Truncated    bool `json:"truncated"`
	// AffinityCap and Alpha are the rule's knobs:
	// score = min(overlap, affinity_cap) - alpha * load.
	AffinityCap int              `json:"affinity_cap"`
	Alpha       float64          `json:"alpha"`
	RequestCost int              `json:"request_cost"`
	Decision    ExplainDecision  `json:"decision"`
	Replicas    []ExplainReplica `json:"replicas"`
}

// ExplainDecision is the replica the policy would choose, and why.
type ExplainDecision struct {
	// Upstream is the chosen replica's opaque id; "" when none is usable.
	Upstream string `json:"upstream"`
	// Reason: affinity, load_override, cold, tie_break or none.
	Reason string `json:"reason"`
	// Tie is the tie-break rule that decided among replicas within
	// tie_epsilon of the best score (depth, profile, rendezvous, load,
	// order), or "none".
	Tie         string  `json:"tie"`
	Overlap     int     `json:"overlap_tokens"`
	BestOverlap int     `json:"best_overlap_tokens"`
	Score       float64 `json:"score"`
	Load        float64 `json:"load_tokens"`
	Prefill     int     `json:"prefill_tokens"`
	Usable      int     `json:"usable"`
}

// ExplainReplica is one replica's side of the rule.
type ExplainReplica struct {
	Upstream string `json:"upstream"`
	Usable   bool   `json:"usable"`
	// Overlap is the raw estimated overlap in tokens, CappedOverlap
	// min(overlap, affinity_cap).
	Overlap       int   `json:"overlap_tokens"`
	CappedOverlap int   `json:"capped_overlap_tokens"`
	Inflight      int64 `json:"inflight"`
	Pending       int64 `json:"pending_prefill_tokens"`
	// Load is load(r) in tokens; Score is null for filtered replicas.
	Load    float64  `json:"load_tokens"`
	Score   *float64 `json:"score"`
	Profile string   `json:"profile"`
	Chosen  bool     `json:"chosen"`
}

func (a *AdminAPI) handleExplain(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	q := r.URL.Query()
	f := lookupFleet(q.Get("fleet"))
	if f == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no live fleet %q", q.Get("fleet"))}
	}
	p := q.Get("path")
	if p == "" {
		p = "/v1/chat/completions"
	}
	ep := selection.EndpointForPath(p)
	if ep == selection.EndpointUnknown {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("path %q is not a chat, completions or responses route", p)}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExplainBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return caddy.APIError{HTTPStatus: http.StatusRequestEntityTooLarge, Err: fmt.Errorf("request body larger than %d bytes", maxExplainBody)}
		}
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("reading request body: %w", err)}
	}
	ex, err := explain(f, ep, body)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	return writeAdminJSON(w, ex)
}

// explain scores every replica of f for body the way the policy would,
// with a scratch of its own: nothing is reserved, learned or sent.
// Candidates are the fleet's replicas in slot order, usable when a live
// policy's pool lists them as available.
func explain(f *fleet, ep selection.Endpoint, body []byte) (Explanation, error) {
	rt := f.router()
	cfg := rt.Config()
	x := rt.Extractor()
	feat := x.NewFeatures()
	if err := x.Parse(ep, body, feat); err != nil {
		return Explanation{}, fmt.Errorf("request body: %w", err)
	}
	snap := snapshotFleet(f)
	cands := make([]selection.Candidate, len(snap.Replicas))
	for i, rp := range snap.Replicas {
		prof := selection.ProfileStandard
		if rp.Profile == "speculative" {
			prof = selection.ProfileSpeculative
		}
		cands[i] = selection.Candidate{Slot: selection.Slot(rp.Slot), Usable: rp.Available, Profile: prof}
	}
	sc := selection.NewScratch(len(cands))
	d := rt.Pick(feat, cands, sc)

	ex := Explanation{
		Fleet: snap.Key, Endpoint: ep.String(), PromptTokens: feat.PromptTokens(cfg),
		Blocks: len(feat.Blocks), Truncated: feat.Truncated,
		AffinityCap: cfg.AffinityCap, Alpha: cfg.Alpha, RequestCost: cfg.RequestCost,
		Decision: ExplainDecision{Reason: d.Reason.String(), Tie: d.Tie.String(),
			Overlap: d.Overlap, BestOverlap: d.BestOverlap, Score: d.Score, Load: d.Load,
			Prefill: d.Prefill, Usable: d.Usable},
		Replicas: make([]ExplainReplica, len(cands)),
	}
	if d.Index >= 0 {
		ex.Decision.Upstream = snap.Replicas[d.Index].ID
	} else {
		ex.Decision.Score = 0
	}
	for i, rp := range snap.Replicas {
		er := ExplainReplica{Upstream: rp.ID, Usable: cands[i].Usable,
			Overlap: sc.Overlap[i], CappedOverlap: min(sc.Overlap[i], cfg.AffinityCap),
			Inflight: rp.Inflight, Pending: rp.PendingPrefill, Load: sc.Load[i],
			Profile: rp.Profile, Chosen: i == d.Index}
		if !math.IsNaN(sc.Score[i]) {
			v := sc.Score[i]
			er.Score = &v
		} else {
			// A filtered replica: report its live load all the same.
			er.Load = rp.Load
		}
		ex.Replicas[i] = er
	}
	return ex, nil
}

func (a *AdminAPI) handleDashboardData(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	h := currentHistory()
	if h == nil {
		// No dashboard is configured: serve current totals from a
		// one-off history without a sampler.
		h = newHistory(metrics(), DefaultSampleInterval, 1)
	}
	return writeAdminJSON(w, h.data(time.Now()))
}

func writeAdminJSON(w http.ResponseWriter, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("encoding JSON: %w", err)}
	}
	w.Header().Set("Content-Type", "application/json")
	_, err = w.Write(append(b, '\n'))
	return err
}

// Interface guards.
var (
	_ caddy.Provisioner = (*AdminAPI)(nil)
	_ caddy.AdminRouter = (*AdminAPI)(nil)
)
