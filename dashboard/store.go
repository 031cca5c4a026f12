package dashboard

import (
	"encoding/json"
	"math"
	"sort"
	"sync"
	"time"
)

// Store samples a source at a fixed interval and keeps the last n samples
// in a ring. The sampler goroutine is owned by the Store: Start starts it,
// Close stops it.
type Store struct {
	source   func(time.Time) Sample
	interval time.Duration

	mu      sync.Mutex
	samples []Sample // ring, oldest at head
	head    int
	count   int

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewStore returns a Store of n samples of source, one per interval.
func NewStore(interval time.Duration, n int, source func(time.Time) Sample) *Store {
	return &Store{source: source, interval: interval, samples: make([]Sample, max(n, 1))}
}

// Interval is the sampling interval.
func (s *Store) Interval() time.Duration { return s.interval }

// Start takes a sample now and then one per interval until Close.
func (s *Store) Start() {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		s.Sample(time.Now())
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			select {
			case now := <-t.C:
				s.Sample(now)
			case <-s.stop:
				return
			}
		}
	}()
}

// Close stops the sampler and waits for it. It may be called again.
func (s *Store) Close() error {
	s.once.Do(func() {
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
	})
	return nil
}

// Sample takes one sample at now.
func (s *Store) Sample(now time.Time) {
	x := s.source(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	i := (s.head + s.count) % len(s.samples)
	if s.count == len(s.samples) {
		s.head = (s.head + 1) % len(s.samples)
	} else {
		s.count++
	}
	s.samples[i] = x
}

// Samples returns the samples oldest first.
func (s *Store) Samples() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Sample, s.count)
	for i := range s.count {
		out[i] = s.samples[(s.head+i)%len(s.samples)]
	}
	return out
}

// Num is a float that encodes NaN as JSON null (a gap in a chart) and
// rounds to three decimals.
type Num float64

func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(math.Round(f*1000) / 1000)
}

// Rates are the rates of one group between consecutive samples.
type Rates struct {
	RPS         []Num `json:"rps"`
	EPS         []Num `json:"eps"`
	OutputTPS   []Num `json:"output_tps"`
	CachedShare []Num `json:"cached_share"`
}

// Data is the JSON the page polls (data.json).
type Data struct {
	Now             int64              `json:"now"`
	IntervalSeconds float64            `json:"interval_seconds"`
	T               []Num              `json:"t"`
	System          Rates              `json:"system"`
	TTFTP50         []Num              `json:"ttft_p50"`
	TTFTP95         []Num              `json:"ttft_p95"`
	Reasons         map[string][]Num   `json:"reasons"`
	IndexBytes      []Num              `json:"index_bytes"`
	IndexBudget     []Num              `json:"index_budget"`
	IndexEntries    []Num              `json:"index_entries"`
	Upstreams       []UpstreamData     `json:"upstreams"`
	Models          []ModelData        `json:"models"`
	Totals          Totals             `json:"totals"`
	Health          Health             `json:"health"`
	Recent          []Record           `json:"recent"`
	ReasonTotals    map[string]float64 `json:"reason_totals"`
}

// Totals are the cumulative counters now.
type Totals struct {
	Requests    float64 `json:"requests"`
	Errors      float64 `json:"errors"`
	Prompt      float64 `json:"prompt_tokens"`
	Cached      float64 `json:"cached_prompt_tokens"`
	CachedShare Num     `json:"cached_share"`
}

// Health counts the usable replicas as GET /health does.
type Health struct {
	Status    string `json:"status"`
	Usable    int    `json:"usable"`
	Upstreams int    `json:"upstreams"`
}

// UpstreamData is one upstream: its gauges now and its series.
type UpstreamData struct {
	ID          string             `json:"id"`
	Fleet       string             `json:"fleet"`
	Healthy     bool               `json:"healthy"`
	Available   bool               `json:"available"`
	Quarantined bool               `json:"quarantined"`
	Inflight    float64            `json:"inflight"`
	Pending     float64            `json:"pending_prefill_tokens"`
	Load        float64            `json:"load_tokens"`
	Requests    float64            `json:"requests"`
	CachedShare Num                `json:"cached_share"`
	Reasons     map[string]float64 `json:"reasons"`
	InflightT   []Num              `json:"inflight_series"`
	Rates
}

// ModelData is one model: its gauges now and its series.
type ModelData struct {
	Model       string  `json:"model"`
	Inflight    float64 `json:"inflight"`
	Requests    float64 `json:"requests"`
	CachedShare Num     `json:"cached_share"`
	InflightT   []Num   `json:"inflight_series"`
	Rates
}

func ratio(a, b float64) Num {
	if b <= 0 {
		return Num(math.NaN())
	}
	return Num(a / b)
}

// active reports any rate above zero.
func active(rates []Num) bool {
	for _, r := range rates {
		if r > 0 {
			return true
		}
	}
	return false
}

// appendRates appends the rates between counts a (earlier) and b.
func (rs *Rates) appendRates(a, b Counts, dt float64) {
	d := func(x, y float64) float64 { return max(0, y-x) }
	rs.RPS = append(rs.RPS, Num(d(a.Requests, b.Requests)/dt))
	rs.EPS = append(rs.EPS, Num(d(a.Errors, b.Errors)/dt))
	rs.OutputTPS = append(rs.OutputTPS, Num(d(a.Output, b.Output)/dt))
	rs.CachedShare = append(rs.CachedShare, ratio(d(a.Cached, b.Cached), d(a.Prompt, b.Prompt)))
}

// Data computes the page's JSON from the samples and a fresh sample of the
// source now, with the recent decisions.
func (s *Store) Data(now time.Time, recent []Record) Data {
	out := Data{Now: now.Unix(), IntervalSeconds: s.interval.Seconds(),
		Reasons: map[string][]Num{}, ReasonTotals: map[string]float64{}, Recent: recent}
	ss := s.Samples()
	// The latest state comes from a fresh sample, so that the page is
	// current even between samples.
	cur := s.source(now)
	if len(ss) > 0 && now.Sub(ss[len(ss)-1].T) >= s.interval/2 {
		ss = append(ss, cur)
	}

	upd := map[string]*UpstreamData{}
	md := map[string]*ModelData{}
	reasons := map[string]bool{}
	for _, x := range append(ss, cur) {
		for id := range x.Up {
			if upd[id] == nil {
				upd[id] = &UpstreamData{ID: id, Reasons: map[string]float64{}}
			}
		}
		for m := range x.Model {
			if md[m] == nil {
				md[m] = &ModelData{Model: m}
			}
		}
		for r := range x.Reasons {
			reasons[r] = true
		}
	}
	for i := 1; i < len(ss); i++ {
		a, b := ss[i-1], ss[i]
		dt := b.T.Sub(a.T).Seconds()
		if dt <= 0 {
			dt = s.interval.Seconds()
		}
		out.T = append(out.T, Num(float64(b.T.UnixMilli())/1000))
		out.System.appendRates(a.All, b.All, dt)
		out.TTFTP50 = append(out.TTFTP50, Num(Quantile(0.5, a.TTFT, b.TTFT)))
		out.TTFTP95 = append(out.TTFTP95, Num(Quantile(0.95, a.TTFT, b.TTFT)))
		out.IndexBytes = append(out.IndexBytes, Num(b.Index.Bytes))
		out.IndexBudget = append(out.IndexBudget, Num(b.Index.Budget))
		out.IndexEntries = append(out.IndexEntries, Num(b.Index.Entries))
		for r := range reasons {
			out.Reasons[r] = append(out.Reasons[r], Num(max(0, b.Reasons[r]-a.Reasons[r])/dt))
		}
		for id, u := range upd {
			var ca, cb Counts
			inflight := math.NaN()
			if x := b.Up[id]; x != nil {
				cb = x.Counts
				inflight = x.Inflight
			}
			if x := a.Up[id]; x != nil {
				ca = x.Counts
			} else {
				ca = cb // appeared in this interval: no rate yet
			}
			u.appendRates(ca, cb, dt)
			u.InflightT = append(u.InflightT, Num(inflight))
		}
		for m, x := range md {
			var ca, cb Counts
			inflight := 0.0
			if y := a.Model[m]; y != nil {
				ca = y.Counts
			}
			if y := b.Model[m]; y != nil {
				cb = y.Counts
				inflight = y.Inflight
			}
			x.appendRates(ca, cb, dt)
			x.InflightT = append(x.InflightT, Num(inflight))
		}
	}

	// Totals and the current gauges; window figures from the first sample.
	var first Sample
	if len(ss) > 0 {
		first = ss[0]
	}
	out.Totals = Totals{Requests: cur.All.Requests, Errors: cur.All.Errors,
		Prompt: cur.All.Prompt, Cached: cur.All.Cached, CachedShare: ratio(cur.All.Cached, cur.All.Prompt)}
	for r, v := range cur.Reasons {
		out.ReasonTotals[r] = v
	}
	for id, u := range upd {
		x := cur.Up[id]
		if x != nil {
			u.Fleet, u.Healthy, u.Available, u.Quarantined = x.Fleet, x.Healthy, x.Available, x.Quarantined
			u.Inflight, u.Pending, u.Load, u.Requests = x.Inflight, x.Pending, x.Load, x.Requests
			u.CachedShare = ratio(x.Cached, x.Prompt)
			for r, v := range x.Reasons {
				base := 0.0
				if f := first.Up[id]; f != nil && len(ss) > 1 {
					base = f.Reasons[r]
				}
				u.Reasons[r] = max(0, v-base)
			}
		}
		if (x != nil && x.Fleet != "") || active(u.RPS) {
			// Live replicas, and departed ones with traffic in the window.
			out.Upstreams = append(out.Upstreams, *u)
		}
	}
	for m, x := range md {
		if y := cur.Model[m]; y != nil {
			x.Inflight, x.Requests = y.Inflight, y.Requests
			x.CachedShare = ratio(y.Cached, y.Prompt)
		}
		if x.Inflight > 0 || active(x.RPS) {
			out.Models = append(out.Models, *x)
		}
	}
	sort.Slice(out.Upstreams, func(i, j int) bool {
		if out.Upstreams[i].Fleet != out.Upstreams[j].Fleet {
			return out.Upstreams[i].Fleet < out.Upstreams[j].Fleet
		}
		return out.Upstreams[i].ID < out.Upstreams[j].ID
	})
	sort.Slice(out.Models, func(i, j int) bool { return out.Models[i].Model < out.Models[j].Model })

	usable, known := 0, 0
	for _, u := range out.Upstreams {
		if x := cur.Up[u.ID]; x == nil || u.Fleet == "" {
			continue // no longer part of a live fleet
		}
		known++
		if u.Healthy { // as /health counts
			usable++
		}
	}
	out.Health = Health{Usable: usable, Upstreams: known}
	switch {
	case usable == 0:
		out.Health.Status = "unhealthy"
	case usable < known:
		out.Health.Status = "degraded"
	default:
		out.Health.Status = "ok"
	}
	return out
}
