package dashboard

import (
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// TTFTBounds are the upper bounds of the time-to-first-token histogram, in
// seconds (the same as the ramjet_time_to_first_token_seconds series).
var TTFTBounds = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Counts are the cumulative counters of one group: everything, one
// upstream or one model.
type Counts struct {
	Requests, Errors       float64
	Prompt, Cached, Output float64
}

// Histogram is a cumulative histogram: Counts[i] observations were at most
// Bounds[i]; the last bound is +Inf.
type Histogram struct {
	Bounds []float64
	Counts []float64
}

func newHistogram(bounds []float64) Histogram {
	b := append(append([]float64(nil), bounds...), math.Inf(1))
	return Histogram{Bounds: b, Counts: make([]float64, len(b))}
}

// Quantile estimates the q-quantile of the observations b has and a had
// not (a may be empty: all of b), interpolating linearly inside a bucket as
// Prometheus' histogram_quantile does. NaN when there are none.
func Quantile(q float64, a, b Histogram) float64 {
	n := len(b.Bounds)
	if n == 0 || len(b.Counts) != n {
		return math.NaN()
	}
	delta := func(i int) float64 {
		if len(a.Counts) == n {
			return max(0, b.Counts[i]-a.Counts[i])
		}
		return b.Counts[i]
	}
	total := delta(n - 1)
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	prevBound, prevCount := 0.0, 0.0
	for i, ub := range b.Bounds {
		c := delta(i)
		if c >= rank {
			if math.IsInf(ub, 1) {
				return prevBound // as histogram_quantile: the highest finite bound
			}
			if c == prevCount {
				return ub
			}
			return prevBound + (ub-prevBound)*(rank-prevCount)/(c-prevCount)
		}
		prevBound, prevCount = ub, c
	}
	return b.Bounds[n-1]
}

// Exchange is one finished request as the Recorder counts it.
type Exchange struct {
	// Upstream is the opaque route id of the replica, "" when none was
	// chosen (the request then counts for its model and the totals only).
	Upstream string
	// Model is the request's model label ("" when unknown).
	Model string
	// Error: the request did not end ok.
	Error bool
	// HasUsage: the response reported Prompt, Cached and Output tokens.
	HasUsage               bool
	Prompt, Cached, Output int64
	// TTFT is the time to the first byte of a streamed response; 0 when
	// it was not streamed or no byte came.
	TTFT time.Duration
}

// Replica is one replica's gauges at sampling time.
type Replica struct {
	ID, Fleet                       string
	Inflight, Pending, Load         float64
	Healthy, Available, Quarantined bool
}

// Index is the approximate index's size at sampling time.
type Index struct {
	Bytes, Budget, Entries float64
}

// Gauges is what the fleet reports at sampling time.
type Gauges struct {
	Replicas []Replica
	Index    Index
}

// UpstreamSample is one upstream in a Sample.
type UpstreamSample struct {
	Counts
	Replica
	Reasons map[string]float64
}

// ModelSample is one model in a Sample.
type ModelSample struct {
	Counts
	Inflight float64
}

// Sample is the state at one instant: cumulative counters (rates are
// computed between samples) and gauges.
type Sample struct {
	T       time.Time
	All     Counts
	TTFT    Histogram
	Reasons map[string]float64
	Up      map[string]*UpstreamSample
	Model   map[string]*ModelSample
	Index   Index
}

// Recorder keeps the cumulative counters the dashboard charts. The set of
// upstreams and models is as bounded as the ids and model labels the
// caller passes (route ids and the bounded model labels). Safe for
// concurrent use; every count is an atomic counter found without a lock
// (every routing decision and request, from every core), which Sample
// adds up.
type Recorder struct {
	// decisions by (upstream, reason), the requests in flight by model,
	// the finished requests' counts by (upstream, model).
	decisions cowMap[string, cowMap[string, Count]] // by upstream, then reason: string keys take the maps' fast path
	inflight  cowMap[string, atomic.Int64]
	tallies   cowMap[pairKey, Tally]
}

// Count is a counter and the time it was created (the metrics expose it
// as a counter series).
type Count struct {
	atomic.Int64
	Created time.Time
}

// cowMap holds values by key in a map copied on each new key (the keys are
// as bounded as the upstreams, reasons and model labels) and read without
// a lock.
type cowMap[K comparable, V any] struct {
	mu   sync.Mutex
	m    atomic.Pointer[map[K]*V]
	init func(*V) // readies a new value, when set
}

// get returns k's value, created zero on first use.
func (c *cowMap[K, V]) get(k K) *V {
	if m := c.m.Load(); m != nil {
		if n := (*m)[k]; n != nil {
			return n
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[K]*V
	if p := c.m.Load(); p != nil {
		old = *p
	}
	if n := old[k]; n != nil {
		return n
	}
	m := make(map[K]*V, len(old)+1)
	for kk, v := range old {
		m[kk] = v
	}
	n := new(V)
	if c.init != nil {
		c.init(n)
	}
	m[k] = n
	c.m.Store(&m)
	return n
}

// each calls f with every key and its value.
func (c *cowMap[K, V]) each(f func(K, *V)) {
	if m := c.m.Load(); m != nil {
		for k, n := range *m {
			f(k, n)
		}
	}
}

// reset forgets every value.
func (c *cowMap[K, V]) reset() {
	c.mu.Lock()
	c.m.Store(nil)
	c.mu.Unlock()
}

// pairKey is the upstream ("" when none was chosen) and model key of a
// finished request.
type pairKey struct{ upstream, model string }

// Tally is the counts of the finished requests of one (upstream, model)
// pair, and their times to first token (per bucket of TTFTBounds, the last
// past every bound), laid out together.
type Tally struct {
	requests, errors       atomic.Int64
	prompt, cached, output atomic.Int64
	ttft                   [16]atomic.Int64
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	if len(TTFTBounds) >= len(Tally{}.ttft) {
		panic("dashboard: more TTFT bounds than a tally holds")
	}
	r := new(Recorder)
	r.decisions.init = func(in *cowMap[string, Count]) { in.init = func(c *Count) { c.Created = time.Now() } }
	return r
}

// Reset forgets every count.
func (r *Recorder) Reset() {
	r.decisions.reset()
	r.inflight.reset()
	r.tallies.reset()
}

// modelKey is the model's name in the samples.
func modelKey(name string) string {
	if name == "" {
		return "unknown"
	}
	return name
}

// Decisions is the counter of routing decisions for upstream ("" when
// none was chosen) by reason: add one per decision.
func (r *Recorder) Decisions(upstream, reason string) *Count {
	return r.decisions.get(upstream).get(reason)
}

// EachDecisions calls f with every counter of decisions and its upstream
// and reason.
func (r *Recorder) EachDecisions(f func(upstream, reason string, c *Count)) {
	r.decisions.each(func(upstream string, in *cowMap[string, Count]) {
		in.each(func(reason string, c *Count) { f(upstream, reason, c) })
	})
}

// Inflight is the counter of model's requests in flight: add one when a
// request starts, take it off when it ends. The samples count model ""
// as "unknown".
func (r *Recorder) Inflight(model string) *atomic.Int64 { return r.inflight.get(model) }

// EachInflight calls f with every counter of requests in flight and its
// model.
func (r *Recorder) EachInflight(f func(model string, c *atomic.Int64)) { r.inflight.each(f) }

// Tally is where the requests of model to upstream ("" when none was
// chosen) are counted when they end (Tally.End). The caller may keep it
// until Reset.
func (r *Recorder) Tally(upstream, model string) *Tally {
	return r.tallies.get(pairKey{upstream, modelKey(model)})
}

// End counts a finished request of t's pair (x.Upstream and x.Model are
// t's). A request with no upstream counts for its model and the totals
// only.
func (t *Tally) End(x Exchange) {
	if x.Error {
		t.errors.Add(1)
	}
	if x.Upstream != "" {
		if x.HasUsage {
			t.prompt.Add(x.Prompt)
			t.cached.Add(x.Cached)
			t.output.Add(x.Output)
		}
		if x.TTFT > 0 {
			t.ttft[sort.SearchFloat64s(TTFTBounds, x.TTFT.Seconds())].Add(1)
		}
	}
	t.requests.Add(1)
}

// Sample returns the counters now with the fleet's gauges g. Models with
// no requests and nothing in flight are left out.
func (r *Recorder) Sample(now time.Time, g Gauges) Sample {
	s := Sample{T: now, TTFT: newHistogram(TTFTBounds), Index: g.Index, Reasons: map[string]float64{},
		Up: map[string]*UpstreamSample{}, Model: map[string]*ModelSample{}}
	upstream := func(id string) *UpstreamSample {
		u := s.Up[id]
		if u == nil {
			u = &UpstreamSample{Replica: Replica{ID: id}, Reasons: map[string]float64{}}
			s.Up[id] = u
		}
		return u
	}
	r.tallies.each(func(k pairKey, t *Tally) {
		c := Counts{Requests: float64(t.requests.Load()), Errors: float64(t.errors.Load()),
			Prompt: float64(t.prompt.Load()), Cached: float64(t.cached.Load()), Output: float64(t.output.Load())}
		if c.Requests == 0 {
			return
		}
		groups := [3]*Counts{&s.All}
		if m := s.Model[k.model]; m != nil {
			groups[1] = &m.Counts
		} else {
			m = &ModelSample{}
			s.Model[k.model], groups[1] = m, &m.Counts
		}
		if k.upstream != "" {
			groups[2] = &upstream(k.upstream).Counts
		}
		for _, g := range groups {
			if g != nil {
				g.Requests += c.Requests
				g.Errors += c.Errors
				g.Prompt += c.Prompt
				g.Cached += c.Cached
				g.Output += c.Output
			}
		}
		n := 0.0
		for i := range s.TTFT.Counts {
			n += float64(t.ttft[i].Load())
			s.TTFT.Counts[i] += n
		}
	})
	r.EachDecisions(func(up, reason string, c *Count) {
		n := float64(c.Load())
		s.Reasons[reason] += n
		if up != "" {
			upstream(up).Reasons[reason] += n
		}
	})
	r.inflight.each(func(k string, c *atomic.Int64) {
		n := c.Load()
		if n == 0 {
			return
		}
		m := s.Model[modelKey(k)]
		if m == nil {
			m = &ModelSample{}
			s.Model[modelKey(k)] = m
		}
		m.Inflight += float64(n)
	})
	for _, rp := range g.Replicas {
		u := upstream(rp.ID)
		u.Fleet = rp.Fleet
		u.Inflight += rp.Inflight
		u.Pending += rp.Pending
		u.Load += rp.Load
		u.Healthy, u.Available, u.Quarantined = rp.Healthy, rp.Available, rp.Quarantined
	}
	return s
}
