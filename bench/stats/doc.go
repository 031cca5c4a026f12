// Package stats holds the one percentile definition of the benchmarks.
//
// Every TTFT, latency and drift percentile that bench/ reports (fleetsim,
// loadgen, e2ecompare, the demo, the overhead benchmark) goes through
// Percentile, so a simulated p95 and an end-to-end p95 are the same
// statistic and can be compared.
//
// The definition is linear interpolation between the closest ranks
// (Hyndman and Fan's type 7, the default of numpy.percentile, R's quantile
// and Excel's PERCENTILE.INC): for n sorted values x[0..n-1] the p-th
// percentile sits at position h = p/100 x (n-1) and is
// x[floor(h)] + (h - floor(h)) x (x[floor(h)+1] - x[floor(h)]).
// It was chosen over the nearest-rank method because it is continuous in p
// and in the data: on the small samples of a short benchmark run (a few
// dozen requests) a nearest-rank p95 jumps from one observation to the
// next when one request is added, which makes two policies look different
// when they are not. p = 0 is the minimum and p = 100 the maximum.
//
// Sample keeps raw observations in bounded memory (a uniform reservoir
// once full), so that long runs still report percentiles by this
// definition rather than from histogram buckets.
package stats
