package module

import (
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/ramjet-llm/ramjet/edge"
)

// DefaultBodyTimeout bounds the reading of one request body (the guard's
// body_timeout): a client trickling its upload is cut off after it with
// 408, instead of holding a connection, a goroutine and a body buffer for
// as long as it likes. Go's server-wide read timeout cannot do this: it
// would also cancel every stream that outlives it.
const DefaultBodyTimeout = 60 * time.Second

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
