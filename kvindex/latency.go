package kvindex

import "github.com/ramjet-llm/ramjet/latency"

// LatencyBuckets are the upper bounds, in seconds, of LatencyHist's
// buckets.
var LatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .075, .1, .15, .2, .25, .5, 1, 2}

// LatencyHist is the histogram of the tokenize preflight's latencies
// (TokenizerConfig.OnLatency), read by a metrics collector.
type LatencyHist = latency.Hist

// NewLatencyHist returns an empty histogram over LatencyBuckets.
func NewLatencyHist() *LatencyHist { return latency.New(LatencyBuckets) }
