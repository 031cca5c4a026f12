package fleetstate

import (
	"fmt"
	"math"

	"github.com/ramjet-llm/ramjet/selection"
)

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
	// Session is what a session-sticky policy would choose, when the
	// policy has session_shadow and the request carries its header.
	Session *ExplainSession `json:"session,omitempty"`
}

// ExplainDecision is the replica the policy would choose, and why.
type ExplainDecision struct {
	// Upstream is the chosen replica's opaque id; "" when none is usable.
	Upstream string `json:"upstream"`
	// Reason: affinity, load_override, cold, tie_break, panic or none.
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

// Explain scores every replica of snap for body the way the policy would,
// with rt (the fleet's Router) and a scratch of its own: nothing is
// reserved, learned or sent. Candidates are the snapshot's replicas in
// slot order, usable when a live policy's pool lists them as available.
func Explain(rt *selection.Router, snap Snapshot, ep selection.Endpoint, body []byte) (Explanation, error) {
	cfg := rt.Config()
	x := rt.Extractor()
	feat := x.NewFeatures()
	if err := x.Parse(ep, body, feat); err != nil {
		return Explanation{}, fmt.Errorf("request body: %w", err)
	}
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
