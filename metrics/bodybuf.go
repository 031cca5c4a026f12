package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/usage"
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

var (
	descFreeHeld = prometheus.NewDesc("ramjet_free_list_objects",
		"Objects a free list holds for reuse (pool=\"request_state\": ramjet's per-request state, 768 bytes each).", []string{"pool"}, nil)
	descFreeLimit = prometheus.NewDesc("ramjet_free_list_limit",
		"The most objects the list holds; one handed back past it is left to the garbage collector.", []string{"pool"}, nil)
	descFreeGets = prometheus.NewDesc("ramjet_free_list_gets_total",
		"Objects taken: result=\"reused\" from the list, \"made\" newly allocated (the list was empty).", []string{"pool", "result"}, nil)
	descFreeReturns = prometheus.NewDesc("ramjet_free_list_returns_total",
		"Objects at the end of their use: result=\"pooled\" kept for reuse, \"dropped\" past the limit, \"kept\" not handed back (a request that ended in an error, or whose reservation or late preflight still referred to it).", []string{"pool", "result"}, nil)
)

// freeLists reads the process's free lists (edge.FreeLists) at scrape time.
type freeLists struct{}

// Describe sends the four descriptors.
func (freeLists) Describe(ch chan<- *prometheus.Desc) {
	ch <- descFreeHeld
	ch <- descFreeLimit
	ch <- descFreeGets
	ch <- descFreeReturns
}

// Collect reads the lists.
func (freeLists) Collect(ch chan<- prometheus.Metric) {
	edge.FreeLists(func(name string, s edge.FreeListStats, held, max int) {
		ch <- prometheus.MustNewConstMetric(descFreeHeld, prometheus.GaugeValue, float64(held), name)
		ch <- prometheus.MustNewConstMetric(descFreeLimit, prometheus.GaugeValue, float64(max), name)
		ch <- prometheus.MustNewConstMetric(descFreeGets, prometheus.CounterValue, float64(s.Reused), name, "reused")
		ch <- prometheus.MustNewConstMetric(descFreeGets, prometheus.CounterValue, float64(s.Made), name, "made")
		ch <- prometheus.MustNewConstMetric(descFreeReturns, prometheus.CounterValue, float64(s.Put-s.Dropped), name, "pooled")
		ch <- prometheus.MustNewConstMetric(descFreeReturns, prometheus.CounterValue, float64(s.Dropped), name, "dropped")
		ch <- prometheus.MustNewConstMetric(descFreeReturns, prometheus.CounterValue, float64(s.Kept), name, "kept")
	})
}

var _ prometheus.Collector = freeLists{}

var (
	descLayouts = prometheus.NewDesc("ramjet_usage_layouts",
		"Layouts of the engines' usage objects kept to read the next answers laid out alike without walking their JSON (usage.Layouts).", nil, nil)
	descLayoutsLimit = prometheus.NewDesc("ramjet_usage_layouts_limit",
		"The most layouts kept (usage.MaxLayouts); an answer laid out otherwise is decoded by its JSON.", nil, nil)
)

// usageLayouts reads the process's kept answer layouts at scrape time.
type usageLayouts struct{}

// Describe sends the two descriptors.
func (usageLayouts) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLayouts
	ch <- descLayoutsLimit
}

// Collect reads the layouts kept.
func (usageLayouts) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descLayouts, prometheus.GaugeValue, float64(usage.Layouts()))
	ch <- prometheus.MustNewConstMetric(descLayoutsLimit, prometheus.GaugeValue, float64(usage.MaxLayouts))
}

var _ prometheus.Collector = usageLayouts{}
