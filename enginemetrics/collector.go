package enginemetrics

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the scrapers' counters and each replica's
// engine-reported figures as ramjet_engine_* series, read at scrape time.
// Create one per process, register it into every registry that should
// serve it (tolerating prometheus.AlreadyRegisteredError), and Add the
// live scrapers under their fleet name.
type Collector struct {
	mu       sync.Mutex
	scrapers map[*Scraper]string
	now      func() time.Time
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector with no scrapers.
func NewCollector() *Collector {
	return &Collector{scrapers: map[*Scraper]string{}, now: time.Now}
}

// Add exports s under fleet (the fleet label); Add again renames it.
func (c *Collector) Add(s *Scraper, fleet string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scrapers[s] = fleet
}

// Remove stops exporting s.
func (c *Collector) Remove(s *Scraper) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.scrapers, s)
}

var (
	fleetLabels   = []string{"fleet"}
	replicaLabels = []string{"fleet", "upstream"}

	descScrapes = prometheus.NewDesc("ramjet_engine_scrapes_total",
		"Scrapes of the engines' /metrics by result: ok, timeout, error, status, too_large, parse.",
		[]string{"fleet", "result"}, nil)
	descDuration = prometheus.NewDesc("ramjet_engine_scrape_duration_seconds",
		"Duration of the scrapes of the engines' /metrics.", fleetLabels, nil)
	descFallback = prometheus.NewDesc("ramjet_engine_fallback_replicas",
		"Replicas without a usable engine scrape (stale or never scraped), routed by local reservations only.",
		fleetLabels, nil)
	descStale = prometheus.NewDesc("ramjet_engine_stale",
		"1 when the replica has no good engine scrape within stale_after intervals (routed by local reservations only).",
		replicaLabels, nil)
	descAge = prometheus.NewDesc("ramjet_engine_snapshot_age_seconds",
		"Age of the replica's last good engine scrape (absent before the first).", replicaLabels, nil)
	descRunning = prometheus.NewDesc("ramjet_engine_running_requests",
		"Requests in the engine's running batch at the last good scrape.", replicaLabels, nil)
	descWaiting = prometheus.NewDesc("ramjet_engine_waiting_requests",
		"Requests in the engine's waiting queue at the last good scrape.", replicaLabels, nil)
	descKVUsage = prometheus.NewDesc("ramjet_engine_kv_usage_ratio",
		"Used share of the engine's KV cache at the last good scrape.", replicaLabels, nil)
	descKVCap = prometheus.NewDesc("ramjet_engine_kv_capacity_tokens",
		"The engine's KV cache capacity in tokens (0: not reported).", replicaLabels, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descScrapes, descDuration, descFallback, descStale, descAge,
		descRunning, descWaiting, descKVUsage, descKVCap} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	type entry struct {
		s     *Scraper
		fleet string
	}
	c.mu.Lock()
	list := make([]entry, 0, len(c.scrapers))
	for s, f := range c.scrapers {
		list = append(list, entry{s, f})
	}
	c.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].fleet < list[j].fleet })
	now := c.now()
	seenFleet := map[string]bool{}
	seenReplica := map[[2]string]bool{}
	for _, e := range list {
		if seenFleet[e.fleet] {
			continue // one scraper per fleet label
		}
		seenFleet[e.fleet] = true
		res := e.s.Results()
		for i, r := range Results {
			ch <- prometheus.MustNewConstMetric(descScrapes, prometheus.CounterValue, float64(res[i]), e.fleet, r.String())
		}
		b, sum, n := e.s.dur.Snapshot()
		ch <- prometheus.MustNewConstHistogram(descDuration, n, sum, b, e.fleet)
		fallback := 0
		for _, sn := range e.s.Snapshots() {
			fresh := sn.Fresh(now)
			if !fresh {
				fallback++
			}
			k := [2]string{e.fleet, sn.ID}
			if sn.ID == "" || seenReplica[k] {
				continue // never label with an address
			}
			seenReplica[k] = true
			g := func(d *prometheus.Desc, v float64) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, e.fleet, sn.ID)
			}
			g(descStale, b2f(!fresh))
			if sn.ScrapedAt.IsZero() {
				continue
			}
			g(descAge, now.Sub(sn.ScrapedAt).Seconds())
			g(descRunning, float64(sn.Metrics.Running))
			g(descWaiting, float64(sn.Metrics.Waiting))
			g(descKVUsage, sn.Metrics.KVUsage)
			g(descKVCap, float64(sn.Metrics.KVCapacityTokens))
		}
		ch <- prometheus.MustNewConstMetric(descFallback, prometheus.GaugeValue, float64(fallback), e.fleet)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
