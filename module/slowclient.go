package module

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/metrics"
)

// DefaultWriteTimeout bounds one write of a response to the client without
// progress (ramjet_observe's write_timeout): a client that stopped reading
// a stream is cut after it.
const DefaultWriteTimeout = 60 * time.Second

// slowReaderCuts counts the responses cut because the client stopped
// reading (write_timeout); process-wide, registered into every config's
// registry.
var slowReaderCuts = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "ramjet_slow_reader_cuts_total",
	Help: "Responses cut because the client made no progress reading them for write_timeout.",
})

func countSlowReader() { slowReaderCuts.Inc() }

// registerSlowClientMetrics registers the slow-client counters into a
// config's registry (nil: none).
func registerSlowClientMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	return metrics.Register(reg, slowReaderCuts)
}
