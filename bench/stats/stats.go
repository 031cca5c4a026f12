package stats

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Percentile returns the p-th percentile (0 <= p <= 100, clamped) of
// sorted, which must be in ascending order, by linear interpolation
// between the closest ranks (see the package documentation). It returns
// NaN when sorted is empty.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	p = min(max(p, 0), 100)
	h := p / 100 * float64(n-1)
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// DefaultSampleCap is the number of observations a zero Sample keeps
// exactly before it starts sampling.
const DefaultSampleCap = 1 << 16

// Sample collects observations in bounded memory: the first Cap of them
// exactly, then a uniform random sample of Cap of all observations
// (reservoir sampling, Vitter's algorithm R, with a fixed seed so that a
// run is reproducible). Percentiles are exact while Count <= Cap. The zero
// value is ready to use with DefaultSampleCap. A Sample is not safe for
// concurrent use.
type Sample struct {
	// Cap bounds the observations kept; 0 means DefaultSampleCap. Set it
	// before the first Add.
	Cap int

	xs     []float64
	n      int64
	sorted bool
	rng    *rand.Rand
}

func (s *Sample) capacity() int {
	if s.Cap > 0 {
		return s.Cap
	}
	return DefaultSampleCap
}

// Add records one observation.
func (s *Sample) Add(x float64) {
	s.n++
	s.sorted = false
	if len(s.xs) < s.capacity() {
		s.xs = append(s.xs, x)
		return
	}
	if s.rng == nil {
		s.rng = rand.New(rand.NewPCG(0x5eed, 0x57a75))
	}
	if i := s.rng.Int64N(s.n); i < int64(len(s.xs)) {
		s.xs[i] = x
	}
}

// Count is the number of observations added (kept or not).
func (s *Sample) Count() int64 { return s.n }

// Percentile is Percentile over the kept observations; NaN when empty.
func (s *Sample) Percentile(p float64) float64 {
	if !s.sorted {
		slices.Sort(s.xs)
		s.sorted = true
	}
	return Percentile(s.xs, p)
}
