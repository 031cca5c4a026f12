package kvindex

import "sort"

// PreflightReport is what one precise-path service recorded of its
// tokenize preflights and predictions, for the bench commands
// (e2ecompare) that run the module in process.
type PreflightReport struct {
	// Sent counts preflights sent; Buckets[i] how many of them took at
	// most Bounds[i] seconds (cumulative); Sum their total seconds.
	Sent    uint64    `json:"sent"`
	Bounds  []float64 `json:"bounds_s"`
	Buckets []uint64  `json:"buckets"`
	Sum     float64   `json:"sum_s"`
	// Fallbacks by FallbackReasons; Late by LateOutcomeNames.
	Fallbacks map[string]uint64 `json:"fallbacks"`
	Late      map[string]uint64 `json:"late"`
	CacheHits uint64            `json:"cache_hits"`
	// Precise and Approx count the decisions by mode.
	Precise uint64 `json:"precise_decisions"`
	Approx  uint64 `json:"approx_decisions"`
	// Predicted is the live predicted entries; PredictionsDropped those
	// dropped at the bound.
	Predicted          int    `json:"predicted"`
	PredictionsDropped uint64 `json:"predictions_dropped"`
	// Waited counts the requests that waited for their preflight;
	// WaitSum is the seconds they waited in all (Precise.Waited).
	Waited  uint64  `json:"waited"`
	WaitSum float64 `json:"wait_sum_s"`
	// PrefixRouted counts the requests routed on a cached message prefix
	// without waiting; PrefixAgreed and PrefixDisagreed the comparisons of
	// cached prefixes with full tokenizations (Precise.PrefixStats).
	PrefixRouted    uint64 `json:"prefix_routed"`
	PrefixAgreed    uint64 `json:"prefix_agreed"`
	PrefixDisagreed uint64 `json:"prefix_disagreed"`
	// Checked counts the precise decisions the wait rule recorded,
	// Diverged those whose exact overlaps differed from the estimate's,
	// Unwaited the requests routed at once by the rule (DivergeStats).
	Checked  uint64 `json:"diverge_checked"`
	Diverged uint64 `json:"diverged"`
	Unwaited uint64 `json:"unwaited"`
}

// NewPreflightReport reads p's counters and the preflights' latencies.
func NewPreflightReport(p *Precise, latency *LatencyHist) PreflightReport {
	b, sum, n := latency.Snapshot()
	x, tk := p.Index(), p.Tokenizer()
	rep := PreflightReport{Sent: n, Sum: sum, Fallbacks: map[string]uint64{}, Late: map[string]uint64{},
		CacheHits: tk.CacheHits(), Predicted: x.Predicted(), PredictionsDropped: x.PredictionsDropped()}
	for le := range b {
		rep.Bounds = append(rep.Bounds, le)
	}
	sort.Float64s(rep.Bounds)
	for _, le := range rep.Bounds {
		rep.Buckets = append(rep.Buckets, b[le])
	}
	for i, r := range FallbackReasons {
		rep.Fallbacks[r] = tk.Fallbacks(i)
	}
	for i, o := range LateOutcomeNames {
		rep.Late[o] = p.LateOutcomes(i)
	}
	rep.Precise, rep.Approx = p.Decisions()
	waited, wait := p.Waited()
	rep.Waited, rep.WaitSum = waited, wait.Seconds()
	rep.PrefixRouted, rep.PrefixAgreed, rep.PrefixDisagreed = p.PrefixStats()
	rep.Checked, rep.Diverged, rep.Unwaited = p.DivergeStats()
	return rep
}

// Within is the share of preflights that took at most sec seconds (sec
// one of Bounds), or -1 when sec is not a bound or none was sent.
func (r PreflightReport) Within(sec float64) float64 {
	if r.Sent == 0 {
		return -1
	}
	for i, le := range r.Bounds {
		if le == sec {
			return float64(r.Buckets[i]) / float64(r.Sent)
		}
	}
	return -1
}
