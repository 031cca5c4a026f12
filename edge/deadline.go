package edge

import (
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// DefaultBodyTimeout bounds the reading of one request body (the guard's
// body_timeout): a client trickling its upload is cut off after it with
// 408, instead of holding a connection, a goroutine and a body buffer for
// as long as it likes. Go's server-wide read timeout cannot do this: it
// would also cancel every stream that outlives it.
const DefaultBodyTimeout = 60 * time.Second

// BodyDeadline sets a read deadline of d on the client connection for the
// reading of r's body; LiftBodyDeadline lifts it again (so that a long
// stream is never cut by it). With minRate > 0 (bytes per second) the
// body must also arrive at that average rate after a grace of
// MinRateGrace: r.Body is wrapped so that every read pushes the deadline
// to start + MinRateGrace + received/minRate (never past the total
// deadline). It reports whether there is nothing to lift: no deadline, no
// body, or a connection that takes no deadline (HTTP/2 and HTTP/3 take
// theirs per stream in Go's servers too; a writer that hides its
// connection). Without minRate it allocates nothing.
func BodyDeadline(w http.ResponseWriter, r *http.Request, d time.Duration, minRate int64) (none bool) {
	if (d <= 0 && minRate <= 0) || r.Body == nil || r.Body == http.NoBody {
		return true
	}
	now := time.Now()
	var hard time.Time
	if d > 0 {
		hard = now.Add(d)
	}
	first := hard
	if minRate > 0 {
		if g := now.Add(MinRateGrace); hard.IsZero() || g.Before(hard) {
			first = g
		}
	}
	if http.NewResponseController(w).SetReadDeadline(first) != nil {
		return true
	}
	if minRate > 0 {
		r.Body = &minRateBody{ReadCloser: r.Body, w: w, rate: minRate, start: now, hard: hard, set: first}
	}
	return false
}

// MinRateGrace is how long a body may take before body_min_rate applies:
// the first bytes of an upload (TCP slow start, the client's own
// encoding) are not held to the rate.
const MinRateGrace = time.Second

// minRateBody pushes the read deadline forward as the body arrives
// (BodyDeadline with a minimum rate).
type minRateBody struct {
	io.ReadCloser
	w     http.ResponseWriter
	rate  int64 // bytes per second
	start time.Time
	hard  time.Time // the total deadline (zero: none)
	n     int64     // bytes received
	set   time.Time // the deadline set last
}

func (b *minRateBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.n += int64(n)
		d := b.start.Add(MinRateGrace + time.Duration(b.n*int64(time.Second)/b.rate))
		if !b.hard.IsZero() && d.After(b.hard) {
			d = b.hard
		}
		if d.Sub(b.set) >= 10*time.Millisecond && http.NewResponseController(b.w).SetReadDeadline(d) == nil {
			b.set = d
		}
	}
	return n, err
}

// DeferredDeadline is BodyDeadline's total deadline without a minimum
// rate, for a body whose every read the server already bounds by at most
// the same d (Caddy's read idle timeout, pushed before each read): the
// deadline, the start plus d, is set only before the body's second read,
// so that a body that arrives in one read (a small request sent with its
// head) costs no deadline to set and lift. The bound is the same: the
// first read ends within d of the start, the rest by the start plus d.
// The struct is the caller's storage (no allocation).
type DeferredDeadline struct {
	io.ReadCloser
	w     http.ResponseWriter
	at    time.Duration // the deadline, since monoBase (a time.Time is 24 bytes)
	reads int32
	set   bool
	done  bool
}

// Defer wraps r's body so that its second read sets the read deadline
// now+d first. Lift ends it.
func (b *DeferredDeadline) Defer(w http.ResponseWriter, r *http.Request, d time.Duration) {
	*b = DeferredDeadline{ReadCloser: r.Body, w: w, at: time.Since(monoBase) + d}
	r.Body = b
}

func (b *DeferredDeadline) Read(p []byte) (int, error) {
	if b.reads++; b.reads == 2 && !b.done && http.NewResponseController(b.w).SetReadDeadline(monoBase.Add(b.at)) == nil {
		b.set = true
	}
	return b.ReadCloser.Read(p)
}

// monoBase is the origin of DeferredDeadline's times: a time it adds to
// carries its monotonic reading, as time.Now's do.
var monoBase = time.Now()

// Lift lifts the deadline a read set, if any; later reads set none.
func (b *DeferredDeadline) Lift() {
	if b.set {
		LiftBodyDeadline(b.w)
	}
	b.set, b.done = false, true
}

// LiftBodyDeadline lifts BodyDeadline's deadline.
func LiftBodyDeadline(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
}

// BodyTimedOut reports whether a body read ended on the read deadline.
func BodyTimedOut(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// BodyTimeout is the 408 of a body not received within the deadline.
func BodyTimeout() *Error {
	return NewError(http.StatusRequestTimeout, TypeInvalidRequest, "request_timeout", "",
		"the request body was not received in time")
}
