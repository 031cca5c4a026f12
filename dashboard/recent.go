package dashboard

import "sync"

// RecentLen is how many recent routing decisions Recent keeps.
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

// Recent keeps the last RecentLen records. The zero value is ready; safe
// for concurrent use.
type Recent struct {
	mu   sync.Mutex
	buf  [RecentLen]Record
	next int
	n    int
}

// Add keeps d, dropping the oldest record when full.
func (r *Recent) Add(d Record) {
	r.mu.Lock()
	r.buf[r.next] = d
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
	r.mu.Unlock()
}

// Reset forgets every record.
func (r *Recent) Reset() {
	r.mu.Lock()
	r.next, r.n = 0, 0
	r.mu.Unlock()
}

// List returns the records newest first.
func (r *Recent) List() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Record, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out
}
