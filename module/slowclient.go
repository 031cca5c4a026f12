package module

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ramjet-llm/ramjet/edge"
	"github.com/ramjet-llm/ramjet/metrics"
)

// DefaultBodyTimeout bounds the reading of one request body (the guard's
// body_timeout): a client trickling its upload is cut off after it with
// 408, instead of holding a connection, a goroutine and a body buffer for
// as long as it likes. Go's server-wide read timeout cannot do this: it
// would also cancel every stream that outlives it.
const DefaultBodyTimeout = 60 * time.Second

// DefaultWriteTimeout bounds one write of a response to the client without
// progress (ramjet_observe's write_timeout): a client that stopped reading
// a stream is cut after it.
const DefaultWriteTimeout = 60 * time.Second

// parseWriteTimeout reads write_timeout: a positive duration or "off".
func parseWriteTimeout(v string) (caddy.Duration, error) {
	if v == "off" {
		return -1, nil
	}
	d, err := caddy.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("want a positive duration or off, got %q", v)
	}
	return caddy.Duration(d), nil
}

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

// bodyDeadline sets a read deadline of d on the client connection for the
// reading of r's body; liftBodyDeadline lifts it again (so that a long
// stream is never cut by it). It reports whether there is nothing to lift:
// no deadline, no body, or a connection that takes no deadline (HTTP/2 and
// HTTP/3 take theirs per stream in Go's servers too; a writer that hides
// its connection). It allocates nothing.
func bodyDeadline(w http.ResponseWriter, r *http.Request, d time.Duration) (none bool) {
	if d <= 0 || r.Body == nil || r.Body == http.NoBody {
		return true
	}
	return http.NewResponseController(w).SetReadDeadline(time.Now().Add(d)) != nil
}

// liftBodyDeadline lifts bodyDeadline's deadline.
func liftBodyDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
}

// bodyTimedOut reports whether a body read ended on the read deadline.
func bodyTimedOut(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// bodyTimeoutError is the 408 of a body not received within the deadline.
func bodyTimeoutError() *edge.Error {
	return edge.NewError(http.StatusRequestTimeout, edge.TypeInvalidRequest, "request_timeout", "",
		"the request body was not received in time")
}
