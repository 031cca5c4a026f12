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

func (h *Histogram) observe(v float64) {
	for i := sort.SearchFloat64s(h.Bounds, v); i < len(h.Counts); i++ {
		h.Counts[i]++
	}
}

func (h Histogram) clone() Histogram {
	return Histogram{Bounds: h.Bounds, Counts: append([]float64(nil), h.Counts...)}
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
// concurrent use.
type Recorder struct {
	mu    sync.Mutex
	all   Counts
	ttft  Histogram
	up    map[string]*UpstreamSample
	model map[string]*ModelSample

	// Counted without the lock (every routing decision and request, from
	// every core): the decisions by (upstream, reason), which Sample adds
	// up, and the requests in flight by model.
	decisions counters[decisionKey]
	inflight  counters[string]
}

// counters are atomic counters by key, in a map copied on each new key
// (the keys are as bounded as the upstreams, reasons and model labels)
// and read without a lock.
type counters[K comparable] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[K]*atomic.Int64]
}

// get returns k's counter.
func (c *counters[K]) get(k K) *atomic.Int64 {
	if m := c.m.Load(); m != nil {
		if n := (*m)[k]; n != nil {
			return n
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[K]*atomic.Int64
	if p := c.m.Load(); p != nil {
		old = *p
	}
	if n := old[k]; n != nil {
		return n
	}
	m := make(map[K]*atomic.Int64, len(old)+1)
	for kk, v := range old {
		m[kk] = v
	}
	n := new(atomic.Int64)
	m[k] = n
	c.m.Store(&m)
	return n
}

// each calls f with every key and its count.
func (c *counters[K]) each(f func(K, int64)) {
	if m := c.m.Load(); m != nil {
		for k, n := range *m {
			f(k, n.Load())
		}
	}
}

// reset forgets every counter.
func (c *counters[K]) reset() {
	c.mu.Lock()
	c.m.Store(nil)
	c.mu.Unlock()
}

// decisionKey is the upstream ("" when none was chosen) and reason of a
// routing decision.
type decisionKey struct{ upstream, reason string }

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	r := new(Recorder)
	r.Reset()
	return r
}

// Reset forgets every count.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = Counts{}
	r.ttft = newHistogram(TTFTBounds)
	r.up = map[string]*UpstreamSample{}
	r.model = map[string]*ModelSample{}
	r.decisions.reset()
	r.inflight.reset()
}

func (r *Recorder) upstream(id string) *UpstreamSample {
	u := r.up[id]
	if u == nil {
		u = &UpstreamSample{Replica: Replica{ID: id}, Reasons: map[string]float64{}}
		r.up[id] = u
	}
	return u
}

// modelKey is the model's name in the samples.
func modelKey(name string) string {
	if name == "" {
		return "unknown"
	}
	return name
}

func (r *Recorder) modelOf(name string) *ModelSample {
	name = modelKey(name)
	m := r.model[name]
	if m == nil {
		m = &ModelSample{}
		r.model[name] = m
	}
	return m
}

// Decision counts one routing decision for upstream ("" when none was
// chosen) by reason.
func (r *Recorder) Decision(upstream, reason string) {
	r.decisions.get(decisionKey{upstream, reason}).Add(1)
}

// Begin counts a request of model in flight; End(model, ...) ends it.
func (r *Recorder) Begin(model string) { r.inflight.get(modelKey(model)).Add(1) }

// End counts a finished request; inflightModel is the model Begin counted.
func (r *Recorder) End(inflightModel string, x Exchange) {
	r.inflight.get(modelKey(inflightModel)).Add(-1)
	r.mu.Lock()
	defer r.mu.Unlock()
	groups := [3]*Counts{&r.all, &r.modelOf(x.Model).Counts}
	if x.Upstream != "" {
		groups[2] = &r.upstream(x.Upstream).Counts
	}
	for _, c := range groups {
		if c == nil {
			continue
		}
		c.Requests++
		if x.Error {
			c.Errors++
		}
		if x.HasUsage && x.Upstream != "" {
			c.Prompt += float64(x.Prompt)
			c.Cached += float64(x.Cached)
			c.Output += float64(x.Output)
		}
	}
	if x.Upstream != "" && x.TTFT > 0 {
		r.ttft.observe(x.TTFT.Seconds())
	}
}

// Sample returns the counters now with the fleet's gauges g. Models with
// no requests and nothing in flight are left out.
func (r *Recorder) Sample(now time.Time, g Gauges) Sample {
	r.mu.Lock()
	s := Sample{T: now, All: r.all, TTFT: r.ttft.clone(), Index: g.Index, Reasons: map[string]float64{},
		Up: make(map[string]*UpstreamSample, len(r.up)), Model: make(map[string]*ModelSample, len(r.model))}
	for id, u := range r.up {
		s.Up[id] = &UpstreamSample{Counts: u.Counts, Replica: Replica{ID: id}, Reasons: map[string]float64{}}
	}
	r.decisions.each(func(k decisionKey, c int64) {
		n := float64(c)
		s.Reasons[k.reason] += n
		if k.upstream == "" {
			return
		}
		u := s.Up[k.upstream]
		if u == nil {
			u = &UpstreamSample{Replica: Replica{ID: k.upstream}, Reasons: map[string]float64{}}
			s.Up[k.upstream] = u
		}
		u.Reasons[k.reason] += n
	})
	for k, m := range r.model {
		if m.Requests != 0 {
			c := *m
			s.Model[k] = &c
		}
	}
	r.inflight.each(func(k string, n int64) {
		if n == 0 {
			return
		}
		c := s.Model[k]
		if c == nil {
			c = &ModelSample{}
			s.Model[k] = c
		}
		c.Inflight = float64(n)
	})
	r.mu.Unlock()
	for _, rp := range g.Replicas {
		u := s.Up[rp.ID]
		if u == nil {
			u = &UpstreamSample{Replica: Replica{ID: rp.ID}, Reasons: map[string]float64{}}
			s.Up[rp.ID] = u
		}
		u.Fleet = rp.Fleet
		u.Inflight += rp.Inflight
		u.Pending += rp.Pending
		u.Load += rp.Load
		u.Healthy, u.Available, u.Quarantined = rp.Healthy, rp.Available, rp.Quarantined
	}
	return s
}
