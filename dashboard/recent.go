package dashboard

// RecentLen is how many recent routing decisions the page lists (package
// metrics keeps them).
const RecentLen = 200

// Record is one routed request as the page lists it: opaque ids and
// numbers only, never prompt text or addresses.
type Record struct {
	Time         int64   `json:"time_ms"`
	Fleet        string  `json:"fleet"`
	Upstream     string  `json:"upstream"`
	Model        string  `json:"model"`
	Reason       string  `json:"reason"`
	Tie          string  `json:"tie,omitempty"`
	Overlap      int     `json:"overlap_tokens"`
	BestOverlap  int     `json:"best_overlap_tokens"`
	Score        float64 `json:"score"`
	Load         float64 `json:"load_tokens"`
	Usable       int     `json:"usable"`
	Outcome      string  `json:"outcome"`
	Status       int     `json:"status"`
	TTFTMillis   float64 `json:"ttft_ms,omitempty"`
	TotalMillis  float64 `json:"duration_ms"`
	PromptTokens int64   `json:"prompt_tokens,omitempty"`
	CachedTokens int64   `json:"cached_prompt_tokens,omitempty"`
}
