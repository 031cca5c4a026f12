package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/edge"
)

var (
	descBodyKept = prometheus.NewDesc("ramjet_body_buffers_kept",
		"Large request-body buffers (64 KiB or more) kept across garbage collections for the next requests (edge.KeptBuffers; at most 64).", nil, nil)
	descBodyKeptBytes = prometheus.NewDesc("ramjet_body_buffers_kept_bytes",
		"Their memory.", nil, nil)
	descBodyKeptLimit = prometheus.NewDesc("ramjet_body_buffers_kept_limit_bytes",
		"The most memory they may hold (edge.KeptBuffersLimit).", nil, nil)
)

// bodyBuffers reads the process's store of large body buffers at scrape
// time.
type bodyBuffers struct{}

// Describe sends the three descriptors.
func (bodyBuffers) Describe(ch chan<- *prometheus.Desc) {
	ch <- descBodyKept
	ch <- descBodyKeptBytes
	ch <- descBodyKeptLimit
}

// Collect reads the store.
func (bodyBuffers) Collect(ch chan<- prometheus.Metric) {
	n, b := edge.KeptBuffers()
	ch <- prometheus.MustNewConstMetric(descBodyKept, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(descBodyKeptBytes, prometheus.GaugeValue, float64(b))
	ch <- prometheus.MustNewConstMetric(descBodyKeptLimit, prometheus.GaugeValue, float64(edge.KeptBuffersLimit))
}

var _ prometheus.Collector = bodyBuffers{}
