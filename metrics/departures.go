package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/fleetstate"
)

var descDepartures = prometheus.NewDesc("ramjet_upstream_departures_total",
	"Replicas the fleet forgot because they left every upstream pool (dynamic upstreams, reloads): their index entries, load and slot were freed.", fleetLabels, nil)

// departuresCollector reads every live fleet's departure count at scrape
// time.
type departuresCollector struct {
	fleets func() []*fleetstate.Fleet
}

// NewDeparturesCollector returns the collector of
// ramjet_upstream_departures_total{fleet} (fleetstate.Fleet.Departures),
// reading fleets at every scrape.
func NewDeparturesCollector(fleets func() []*fleetstate.Fleet) prometheus.Collector {
	return &departuresCollector{fleets: fleets}
}

// Describe sends the one descriptor.
func (c *departuresCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descDepartures }

// Collect reads the fleets.
func (c *departuresCollector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.fleets() {
		ch <- prometheus.MustNewConstMetric(descDepartures, prometheus.CounterValue, float64(f.Departures()), f.StateKey)
	}
}

var _ prometheus.Collector = (*departuresCollector)(nil)
