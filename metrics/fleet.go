package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/selection"
)

// fleetCollector reads every live fleet's Router at scrape time (as
// prometheus' example_clustermanager_test.go): the core knows nothing of
// Prometheus.
type fleetCollector struct {
	snap func() []fleetstate.Snapshot
}

// NewFleetCollector returns the collector of the fleet series (ramjet_upstream_*,
// ramjet_index_*, ramjet_upstreams), reading snap at every scrape.
func NewFleetCollector(snap func() []fleetstate.Snapshot) prometheus.Collector {
	return &fleetCollector{snap: snap}
}

var (
	fleetLabels   = []string{"fleet"}
	replicaLabels = []string{"fleet", "upstream"}

	descInflight = prometheus.NewDesc("ramjet_upstream_inflight_requests",
		"Requests ramjet has reserved on the upstream and not yet released.", replicaLabels, nil)
	descPending = prometheus.NewDesc("ramjet_upstream_pending_prefill_tokens",
		"Estimated prompt tokens the upstream has yet to prefill for ramjet's in-flight requests.", replicaLabels, nil)
	descLoad = prometheus.NewDesc("ramjet_upstream_load_tokens",
		"Live load of the upstream as the routing rule sees it: request_cost per in-flight request plus pending prefill, in tokens.", replicaLabels, nil)
	descHealthy = prometheus.NewDesc("ramjet_upstream_healthy",
		"1 when the upstream passes Caddy's health checks, else 0.", replicaLabels, nil)
	descAvailable = prometheus.NewDesc("ramjet_upstream_available",
		"1 when the upstream can take requests (healthy, not quarantined, under its request limit), else 0.", replicaLabels, nil)
	descQuarantined = prometheus.NewDesc("ramjet_upstream_quarantined",
		"1 when the upstream is healthy but taken out of rotation by passive health checks (too many recent failures), else 0.", replicaLabels, nil)
	descEntries = prometheus.NewDesc("ramjet_index_entries",
		"Prefix blocks held by the approximate index.", fleetLabels, nil)
	descBytes = prometheus.NewDesc("ramjet_index_bytes",
		"Memory held by the approximate index, in bytes.", fleetLabels, nil)
	descBudget = prometheus.NewDesc("ramjet_index_budget_bytes",
		"Memory budget of the approximate index, in bytes.", fleetLabels, nil)
	descEvictions = prometheus.NewDesc("ramjet_index_evictions_total",
		"Prefix blocks evicted from the approximate index to stay within its budget.", fleetLabels, nil)
	descLearnsQueued = prometheus.NewDesc("ramjet_index_learns_queued_total",
		"Learns the approximate index applied off the request path (its learn queue: prompts with many blocks new to the chosen replica).", fleetLabels, nil)
	descLearnsInline = prometheus.NewDesc("ramjet_index_learns_inline_total",
		"Learns of queueing size made on the request path because the index's learn queue was full (none is ever dropped).", fleetLabels, nil)
	descEjected = prometheus.NewDesc("ramjet_upstream_ejected",
		"1 when outlier detection holds the upstream out (its recent answers failed: 5xx, connection failures, cut streams, timeouts), else 0.", replicaLabels, nil)
	descEjections = prometheus.NewDesc("ramjet_ejections_total",
		"Ejections of the upstream by outlier detection, by the kind of the failure that ejected it (status, connect, cut, timeout).", append(replicaLabels, "reason"), nil)
	descDensity = prometheus.NewDesc("ramjet_prompt_bytes_per_token",
		"The prompts' bytes per real token, learned from the engines' usage.prompt_tokens (chars_per_token before any answer); above chars_per_token the engines' KV capacities are applied to the index's estimated tokens at it.", fleetLabels, nil)
	descOthers = prometheus.NewDesc("ramjet_other_instances_seen",
		"1 while the engines' answers (cached tokens past what this instance sent) show prompts other ramjet instances placed on the fleet's replicas, among the last 1024 answers: the agreement band is on; else 0.", fleetLabels, nil)
	descReplicas = prometheus.NewDesc("ramjet_upstreams",
		"Replicas known to the fleet (every data-parallel rank counts).", fleetLabels, nil)
)

// Describe sends the fixed descriptors: the set of series varies with the
// fleet, the descriptors never do.
func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInflight, descPending, descLoad, descHealthy,
		descAvailable, descQuarantined, descEjected, descEjections, descEntries, descBytes, descBudget, descEvictions, descLearnsQueued, descLearnsInline, descOthers, descDensity, descReplicas} {
		ch <- d
	}
}

// Collect reads the fleets.
func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.snap() {
		ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(f.IndexEntries), f.Key)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(f.IndexBytes), f.Key)
		ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(f.IndexBudget), f.Key)
		ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(f.IndexEvictions), f.Key)
		ch <- prometheus.MustNewConstMetric(descLearnsQueued, prometheus.CounterValue, float64(f.IndexLearnsQueued), f.Key)
		ch <- prometheus.MustNewConstMetric(descLearnsInline, prometheus.CounterValue, float64(f.IndexLearnsInline), f.Key)
		ch <- prometheus.MustNewConstMetric(descReplicas, prometheus.GaugeValue, float64(len(f.Replicas)), f.Key)
		ch <- prometheus.MustNewConstMetric(descOthers, prometheus.GaugeValue, b2f(f.OtherInstances), f.Key)
		ch <- prometheus.MustNewConstMetric(descDensity, prometheus.GaugeValue, f.Density, f.Key)
		seen := make(map[string]bool, len(f.Replicas))
		for _, r := range f.Replicas {
			if r.ID == "" || seen[r.ID] {
				continue
			}
			seen[r.ID] = true
			ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(r.Inflight), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(r.PendingPrefill), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descLoad, prometheus.GaugeValue, r.Load, f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, b2f(r.Healthy), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descAvailable, prometheus.GaugeValue, b2f(r.Available), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descQuarantined, prometheus.GaugeValue, b2f(r.Quarantined), f.Key, r.ID)
			ch <- prometheus.MustNewConstMetric(descEjected, prometheus.GaugeValue, b2f(r.Ejected), f.Key, r.ID)
			for i, k := range selection.FailureKinds {
				ch <- prometheus.MustNewConstMetric(descEjections, prometheus.CounterValue, float64(r.Ejections[i]), f.Key, r.ID, k.String())
			}
		}
	}
}

var _ prometheus.Collector = (*fleetCollector)(nil)
