package loadgen

import (
	"math"
	"time"

	"github.com/ramjet-llm/ramjet/bench/stats"
)

// Histogram records durations in logarithmic buckets (about 1% relative
// precision) between 1µs and about 1h, in constant memory. Values outside
// that range are clamped into the first or last bucket. It is not safe for
// concurrent use.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64 // seconds
	min    time.Duration
	max    time.Duration
}

const (
	histMin     = time.Microsecond
	histGrowth  = 1.01
	histBuckets = 2200 // 1.01^2200 ≈ 3.2e9 -> about 53 minutes above histMin
)

var histLogGrowth = math.Log(histGrowth)

func histIndex(d time.Duration) int {
	if d <= histMin {
		return 0
	}
	i := int(math.Log(float64(d)/float64(histMin)) / histLogGrowth)
	if i >= histBuckets {
		return histBuckets - 1
	}
	return i
}

// Record adds one observation.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[histIndex(d)]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	if d > h.max {
		h.max = d
	}
	h.n++
	h.sum += d.Seconds()
}

// Merge adds every observation of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.n }

// Mean is the mean observation, 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n) * float64(time.Second))
}

// Quantile returns the q-quantile (0 <= q <= 1) by the definition of
// stats.Percentile (linear interpolation between the closest ranks), with
// each rank's value read from its bucket: accurate to about 1%, exact at
// q=0 and q=1. It returns 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q <= 0 {
		return h.min
	}
	if q >= 1 {
		return h.max
	}
	pos := q * float64(h.n-1)
	lo := uint64(math.Floor(pos))
	a, b := h.rankValue(lo), h.rankValue(min(lo+1, h.n-1))
	return a + time.Duration((pos-float64(lo))*float64(b-a))
}

// rankValue is the value of the observation of 0-based rank r: the
// geometric middle of its bucket, clamped to the observed range, and exact
// for the first and the last rank.
func (h *Histogram) rankValue(r uint64) time.Duration {
	if r == 0 {
		return h.min
	}
	if r >= h.n-1 {
		return h.max
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > r {
			v := time.Duration(float64(histMin) * math.Pow(histGrowth, float64(i)+0.5))
			if i == 0 {
				v = h.min
			}
			return max(h.min, min(v, h.max))
		}
	}
	return h.max
}

// quantile returns the q-quantile (0..1) of sorted values by the
// definition of stats.Percentile, NaN when empty.
func quantile(sorted []float64, q float64) float64 {
	return stats.Percentile(sorted, 100*q)
}

// maxSamples bounds the raw observations kept per distribution (TTFT,
// end-to-end latency, queue delay): exact percentiles up to this many
// completed requests, a uniform sample beyond.
const maxSamples = 1 << 20

// durations collects one distribution in bounded memory: a stats.Sample
// of milliseconds plus the exact count, sum and maximum.
type durations struct {
	s   stats.Sample
	sum float64
	max float64
}

func (d *durations) add(x time.Duration) {
	v := ms(x)
	if d.s.Cap == 0 {
		d.s.Cap = maxSamples
	}
	d.s.Add(v)
	d.sum += v
	if d.s.Count() == 1 || v > d.max {
		d.max = v
	}
}

// Dist summarises a set of durations.
type Dist struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// distOf summarises a distribution, its percentiles by stats.Percentile.
func distOf(d *durations) Dist {
	n := d.s.Count()
	if n == 0 {
		return Dist{}
	}
	return Dist{
		Count: int(n),
		Mean:  d.sum / float64(n),
		P50:   d.s.Percentile(50),
		P90:   d.s.Percentile(90),
		P95:   d.s.Percentile(95),
		P99:   d.s.Percentile(99),
		Max:   d.max,
	}
}

// distOfHist summarises a histogram.
func distOfHist(h *Histogram) Dist {
	if h.Count() == 0 {
		return Dist{}
	}
	return Dist{
		Count: int(h.Count()),
		Mean:  ms(h.Mean()),
		P50:   ms(h.Quantile(0.50)),
		P90:   ms(h.Quantile(0.90)),
		P95:   ms(h.Quantile(0.95)),
		P99:   ms(h.Quantile(0.99)),
		Max:   ms(h.Quantile(1)),
	}
}
