package dashboard

import (
	"math"
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

// Gauges is what the fleet and the caller's counters (package metrics'
// records) report at sampling time: Ended the finished requests and those
// in flight by (upstream, model) pair, Decided the routing decisions by (upstream,
// reason), TTFT the routed streams' times to first token per bucket of
// TTFTBounds (the last past every bound; not cumulative). Upstream is ""
// for what no replica was chosen for; a model "" counts as "unknown".
type Gauges struct {
	Replicas []Replica
	Index    Index
	Ended    []Ended
	Decided  []Decided
	TTFT     []float64
}

// Ended is the cumulative counts of one (upstream, model) pair's finished
// requests, and how many of its requests are in flight.
type Ended struct {
	Upstream, Model string
	Counts
	Inflight float64
}

// Decided is the cumulative count of one (upstream, reason) pair's
// routing decisions.
type Decided struct {
	Upstream, Reason string
	N                float64
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

// modelKey is the model's name in the samples.
func modelKey(name string) string {
	if name == "" {
		return "unknown"
	}
	return name
}

// SampleOf is the sample at now of the caller's counters and the fleet's
// gauges g. Models with no requests and nothing in flight are left out.
func SampleOf(now time.Time, g Gauges) Sample {
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
	for _, e := range g.Ended {
		c := e.Counts
		if c.Requests == 0 {
			continue
		}
		groups := [3]*Counts{&s.All}
		key := modelKey(e.Model)
		if m := s.Model[key]; m != nil {
			groups[1] = &m.Counts
		} else {
			m = &ModelSample{}
			s.Model[key], groups[1] = m, &m.Counts
		}
		if e.Upstream != "" {
			groups[2] = &upstream(e.Upstream).Counts
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
	}
	n := 0.0
	for i := range min(len(g.TTFT), len(s.TTFT.Counts)) {
		n += g.TTFT[i]
		s.TTFT.Counts[i] = n
	}
	for _, d := range g.Decided {
		s.Reasons[d.Reason] += d.N
		if d.Upstream != "" {
			upstream(d.Upstream).Reasons[d.Reason] += d.N
		}
	}
	for _, e := range g.Ended {
		if e.Inflight == 0 {
			continue
		}
		m := s.Model[modelKey(e.Model)]
		if m == nil {
			m = &ModelSample{}
			s.Model[modelKey(e.Model)] = m
		}
		m.Inflight += e.Inflight
	}
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
