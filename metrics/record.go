package metrics

import (
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ramjet-llm/ramjet/dashboard"
	"github.com/ramjet-llm/ramjet/selection"
)

// The series a finished request updates (requests, tokens, responses
// without usage, TTFT, duration) are kept in one record per (upstream,
// model label) pair and one per upstream, plain atomics laid out together,
// and exposed at scrape time by a collector (requestSeries) with the
// names, help, labels, types and values the labelled vectors had: a
// request's end touches a few cache lines of its pair instead of a vector
// child per series (each its own object, a histogram three of them). The
// routing decisions are counted on their upstream's record too, by reason,
// and the requests in flight on the pair of their first attempt. The
// dashboard reads the records' counts when it samples
// (Set.DashboardSample): one counter per event, not two. A series exists
// from its first observation on, as a vector's child did.

// Bits of a record's seen flags: which of its series exist.
const (
	seenTokens   = 1 << (len(outcomes) + iota) // pair: prompt, cached and completion tokens
	seenNoUse                                  // upstream: responses without usage
	seenTTFT                                   // upstream: time to first token
	seenDuration                               // upstream: request duration
	seenDecided                                // upstream: the first of its decisions by reason (reasonLabels)
)

// seenInflight: a pair's requests in flight were counted (after the
// decisions' bits).
const seenInflight = seenDecided << len(reasonLabels)

// The bucket bounds of request_duration_seconds, selection_duration_seconds
// (1µs .. 65ms) and prefix_overlap_tokens.
var (
	durationBounds = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	selectBounds   = prometheus.ExponentialBuckets(1e-6, 4, 9)
	overlapBounds  = []float64{0, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768}
)

// decided is the histograms of the routing decisions (never reset, as an
// unlabelled histogram could not be), and when they were created.
type decided struct {
	sel, overlap hist
	created      time.Time
}

// hist is a histogram's state: observations per bucket (the last past
// every bound), their sum (float64 bits) and the bounds.
type hist struct {
	sum     atomic.Uint64
	buckets [14]atomic.Uint64 // room for len(durationBounds)+1 and len(dashboard.TTFTBounds)+1
}

func (h *hist) observe(bounds []float64, v float64) {
	// sort.SearchFloat64s's index (the first bound >= v; len(bounds) for
	// NaN) by a scan from the first: the request path's values sit in
	// the first few of at most 13 bounds.
	i := 0
	for i < len(bounds) && !(bounds[i] >= v) {
		i++
	}
	h.buckets[i].Add(1)
	for {
		old := h.sum.Load()
		if h.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// metric is h as a constant histogram: cumulative buckets, their count.
func (h *hist) metric(d *prometheus.Desc, bounds []float64, created time.Time, labels ...string) prometheus.Metric {
	cum := make(map[float64]uint64, len(bounds))
	var n uint64
	for i, b := range bounds {
		n += h.buckets[i].Load()
		cum[b] = n
	}
	n += h.buckets[len(bounds)].Load()
	return prometheus.MustNewConstHistogramWithCreatedTimestamp(d, n, math.Float64frombits(h.sum.Load()), cum, created, labels...)
}

// upRecord is one upstream's series, and its pairs by model label.
type upRecord struct {
	pairs    atomic.Pointer[map[string]*pairRecord] // copied when a pair joins (under records.mu)
	seen     atomic.Uint32
	noUse    atomic.Uint64
	duration hist
	ttft     hist
	created  [3]time.Time // noUse, ttft, duration: when each series appeared
	decided  [len(reasonLabels)]atomic.Uint64
	dcreated [len(reasonLabels)]time.Time
}

// pairRecord is one (upstream, model label) pair's series; up is its
// upstream's.
type pairRecord struct {
	seen                   atomic.Uint32
	requests               [len(outcomes)]atomic.Uint64
	prompt, cached, output atomic.Uint64
	inflight               atomic.Int64
	up                     *upRecord
	upstream, model        string
	created                [len(outcomes) + 1]time.Time // requests by outcome, tokens
}

// copyWith returns a copy of *old (nil: none) with k set to v, for a map
// read without a lock and replaced under one.
func copyWith[K comparable, V any](old *map[K]V, k K, v V) *map[K]V {
	var m map[K]V
	if old != nil {
		m = make(map[K]V, len(*old)+1)
		maps.Copy(m, *old)
	} else {
		m = make(map[K]V, 1)
	}
	m[k] = v
	return &m
}

// records are the upstream records by route id and their pair records by
// model label, in maps copied when one joins (as bounded as the labels),
// read without a lock (two string-keyed lookups: the map's fast path for
// string keys, where one struct key took the generic one), and the
// tie-breaks by rule.
type records struct {
	mu sync.Mutex // held to add an upstream or a pair or mark a series seen
	m  atomic.Pointer[map[string]*upRecord]

	tieSeen    atomic.Uint32
	ties       [8]atomic.Uint64 // by selection.TieRule
	tieCreated [8]time.Time
}

// Fails to compile when the tie-break rules outgrow records.ties.
var _ [8 - 1 - int(selection.TieOrder)]struct{}

// tie counts a decision settled by the tie-break rule t.
func (r *records) tie(t selection.TieRule) {
	r.mark(&r.tieSeen, 1<<t, &r.tieCreated[t])
	r.ties[t].Add(1)
}

// up returns the record of upstream.
func (r *records) up(upstream string) *upRecord {
	if m := r.m.Load(); m != nil {
		if u := (*m)[upstream]; u != nil {
			return u
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var u *upRecord
	if m := r.m.Load(); m != nil {
		u = (*m)[upstream]
	}
	if u == nil {
		u = new(upRecord)
		r.m.Store(copyWith(r.m.Load(), upstream, u))
	}
	return u
}

// get returns the record of the pair (upstream, model).
func (r *records) get(upstream, model string) *pairRecord {
	u := r.up(upstream)
	if ps := u.pairs.Load(); ps != nil {
		if p := (*ps)[model]; p != nil {
			return p
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := u.pairs.Load()
	if ps != nil && (*ps)[model] != nil {
		return (*ps)[model]
	}
	p := &pairRecord{up: u, upstream: upstream, model: model}
	u.pairs.Store(copyWith(ps, model, p))
	return p
}

// decide counts a routing decision for u by reason (an index into
// reasonLabels).
func (r *records) decide(u *upRecord, reason int) {
	r.mark(&u.seen, seenDecided<<reason, &u.dcreated[reason])
	u.decided[reason].Add(1)
}

// mark records that the series bit of seen exists from now on (created
// is where its creation time goes, nil: nowhere). Inlined: a series that exists (every
// request but its first) costs a load, not a call.
func (r *records) mark(seen *atomic.Uint32, bit uint32, created *time.Time) {
	if seen.Load()&bit == 0 {
		r.markNew(seen, bit, created)
	}
}

func (r *records) markNew(seen *atomic.Uint32, bit uint32, created *time.Time) {
	r.mu.Lock()
	if seen.Load()&bit == 0 {
		if created != nil {
			*created = time.Now()
		}
		seen.Or(bit)
	}
	r.mu.Unlock()
}

// dashboard is the records' counts as the dashboard samples them: the
// finished requests by pair, the decisions by (upstream, reason) and the
// routed streams' times to first token per bucket of dashboard.TTFTBounds.
func (r *records) dashboard() (ended []dashboard.Ended, decided []dashboard.Decided, ttft []float64) {
	ttft = make([]float64, len(dashboard.TTFTBounds)+1)
	m := r.m.Load()
	if m == nil {
		return nil, nil, ttft
	}
	for id, u := range *m {
		if ps := u.pairs.Load(); ps != nil {
			for _, p := range *ps {
				c := dashboard.Counts{Prompt: float64(p.prompt.Load()), Cached: float64(p.cached.Load()), Output: float64(p.output.Load())}
				for oi := range p.requests {
					n := float64(p.requests[oi].Load())
					c.Requests += n
					if oi != 0 { // not ok
						c.Errors += n
					}
				}
				ended = append(ended, dashboard.Ended{Upstream: p.upstream, Model: p.model, Counts: c, Inflight: float64(p.inflight.Load())})
			}
		}
		seen := u.seen.Load()
		for ri, reason := range reasonLabels {
			if seen&(seenDecided<<ri) != 0 {
				decided = append(decided, dashboard.Decided{Upstream: id, Reason: reason, N: float64(u.decided[ri].Load())})
			}
		}
		for i := range ttft {
			ttft[i] += float64(u.ttft.buckets[i].Load())
		}
	}
	return ended, decided, ttft
}

// reset forgets every record.
func (r *records) reset() {
	r.mu.Lock()
	r.m.Store(nil)
	r.tieSeen.Store(0)
	for i := range r.ties {
		r.ties[i].Store(0)
	}
	r.mu.Unlock()
}

// end records a finished request of the pair p: its outcome (index into
// outcomes) and, with an upstream, its usage, TTFT and duration. The
// request counts last, so that a scrape that sees it sees the rest too.
func (r *records) end(p *pairRecord, oi int, x *Exchange) {
	if x.Upstream != "" {
		u := p.up
		if x.HasUsage {
			r.mark(&p.seen, seenTokens, &p.created[len(outcomes)])
			p.prompt.Add(uint64(x.Usage.PromptTokens))
			p.cached.Add(uint64(x.Usage.CachedTokens))
			p.output.Add(uint64(x.Usage.CompletionTokens))
		} else if oi == 0 {
			r.mark(&u.seen, seenNoUse, &u.created[0])
			u.noUse.Add(1)
		}
		if x.Stream && !x.FirstByte.IsZero() {
			r.mark(&u.seen, seenTTFT, &u.created[1])
			u.ttft.observe(dashboard.TTFTBounds, x.FirstByte.Sub(x.Start).Seconds())
		}
		if !x.End.IsZero() {
			r.mark(&u.seen, seenDuration, &u.created[2])
			u.duration.observe(durationBounds, x.End.Sub(x.Start).Seconds())
		}
	}
	r.mark(&p.seen, 1<<oi, &p.created[oi])
	p.requests[oi].Add(1)
}

// requestSeries is the collector of the records' series (requests in
// flight, decisions, finished requests) and the decisions' histograms.
type requestSeries struct {
	r                                                       *records
	d                                                       *decided
	decisions, inflight, sel, overlap, ties                 *prometheus.Desc
	requests, prompt, cached, output, noUse, ttft, duration *prometheus.Desc
}

func newRequestSeries(r *records, dh *decided) *requestSeries {
	for _, b := range [][]float64{durationBounds, selectBounds, overlapBounds, dashboard.TTFTBounds} {
		if len(b) >= len(hist{}.buckets) {
			panic("metrics: more bucket bounds than a hist holds")
		}
	}
	dh.created = time.Now()
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil)
	}
	return &requestSeries{r: r, d: dh,
		sel:       d("selection_duration_seconds", "Time the ramjet policy spent choosing an upstream (fingerprint, score, pick), in seconds."),
		overlap:   d("prefix_overlap_tokens", "Estimated prompt-prefix overlap with the chosen upstream's cache at decision time, in tokens."),
		decisions: d("routing_decisions_total", "Routing decisions of the ramjet policy, by chosen upstream and reason (affinity, load_override, cold, tie_break, fallback, panic, none).", "upstream", "reason"),
		inflight:  d("model_inflight_requests", "Requests in flight through ramjet, by model.", "model"),
		ties:      d("tie_breaks_total", "Routing decisions settled by a tie-break, by the rule that decided (depth, profile, rendezvous, load, order).", "rule"),
		requests:  d("requests_total", "Requests that ended, by upstream, model and outcome (ok, client_error, upstream_error, no_replica, canceled).", "upstream", "model", "outcome"),
		prompt:    d("prompt_tokens_total", "Prompt tokens reported in the engines' response usage, by upstream and model.", "upstream", "model"),
		cached:    d("cached_prompt_tokens_total", "Prompt tokens the engines served from their prefix cache (usage cached_tokens), by upstream and model.", "upstream", "model"),
		output:    d("completion_tokens_total", "Completion (output) tokens reported in the engines' response usage, by upstream and model.", "upstream", "model"),
		noUse:     d("responses_without_usage_total", "Successful responses that carried no usage object (e.g. a stream without stream_options.include_usage), by upstream.", "upstream"),
		ttft:      d("time_to_first_token_seconds", "Time from the request reaching ramjet to the first byte of a streamed response, by upstream, in seconds.", "upstream"),
		duration:  d("request_duration_seconds", "Time from the request reaching ramjet to the end of its response, by upstream, in seconds.", "upstream"),
	}
}

func (e *requestSeries) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{e.decisions, e.inflight, e.sel, e.overlap, e.ties, e.requests, e.prompt, e.cached, e.output, e.noUse, e.ttft, e.duration} {
		ch <- d
	}
}

func (e *requestSeries) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, created time.Time, labels ...string) {
		ch <- prometheus.MustNewConstMetricWithCreatedTimestamp(d, prometheus.CounterValue, float64(v), created, labels...)
	}
	ch <- e.d.sel.metric(e.sel, selectBounds, e.d.created)
	ch <- e.d.overlap.metric(e.overlap, overlapBounds, e.d.created)
	for t := range e.r.ties {
		if e.r.tieSeen.Load()&(1<<t) != 0 {
			counter(e.ties, e.r.ties[t].Load(), e.r.tieCreated[t], selection.TieRule(t).String())
		}
	}
	m := e.r.m.Load()
	if m == nil {
		return
	}
	inflight := map[string]int64{} // by model label, over the pairs
	for id, u := range *m {
		if ps := u.pairs.Load(); ps != nil {
			for _, p := range *ps {
				seen := p.seen.Load()
				if seen&seenInflight != 0 {
					inflight[p.model] += p.inflight.Load()
				}
				for oi, o := range outcomes {
					if seen&(1<<oi) != 0 {
						counter(e.requests, p.requests[oi].Load(), p.created[oi], p.upstream, p.model, o)
					}
				}
				if seen&seenTokens != 0 {
					c := p.created[len(outcomes)]
					counter(e.prompt, p.prompt.Load(), c, p.upstream, p.model)
					counter(e.cached, p.cached.Load(), c, p.upstream, p.model)
					counter(e.output, p.output.Load(), c, p.upstream, p.model)
				}
			}
		}
		seen := u.seen.Load()
		for ri, reason := range reasonLabels {
			if seen&(seenDecided<<ri) != 0 {
				counter(e.decisions, u.decided[ri].Load(), u.dcreated[ri], id, reason)
			}
		}
		if seen&seenNoUse != 0 {
			counter(e.noUse, u.noUse.Load(), u.created[0], id)
		}
		if seen&seenTTFT != 0 {
			ch <- u.ttft.metric(e.ttft, dashboard.TTFTBounds, u.created[1], id)
		}
		if seen&seenDuration != 0 {
			ch <- u.duration.metric(e.duration, durationBounds, u.created[2], id)
		}
	}
	for model, n := range inflight {
		ch <- prometheus.MustNewConstMetric(e.inflight, prometheus.GaugeValue, float64(n), model)
	}
}

// Value is the value of the series ramjet_<name> whose labels are exactly
// labelPairs (name, value, ...) in m's own registry: a counter's or a
// gauge's value, a histogram's count; false when it does not exist (tests
// read the series as a scrape does).
func (m *Set) Value(name string, labelPairs ...string) (float64, bool) {
	mfs, err := m.Own.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != namespace+"_"+name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			if len(s.GetLabel())*2 != len(labelPairs) {
				continue
			}
			for i := 0; i < len(labelPairs); i += 2 {
				j := slices.IndexFunc(s.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == labelPairs[i] })
				if j < 0 || s.GetLabel()[j].GetValue() != labelPairs[i+1] {
					continue series
				}
			}
			switch {
			case s.Counter != nil:
				return s.Counter.GetValue(), true
			case s.Gauge != nil:
				return s.Gauge.GetValue(), true
			case s.Histogram != nil:
				return float64(s.Histogram.GetSampleCount()), true
			}
		}
	}
	return 0, false
}
