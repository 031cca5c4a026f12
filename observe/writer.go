package observe

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"
)

// Observer watches one response as it streams to the client. Its methods
// are called on the request's goroutine, in order: WriteHeader for the
// final status (once; h is the response header, still writable), Write for
// each chunk of body (p is only valid during the call), End when the
// handler chain returned (err is its error; status 0 when nothing was
// written).
type Observer interface {
	WriteHeader(status int, h http.Header)
	Write(p []byte)
	End(status int, err error)
}

// Writer feeds its observers, in order, what is written through it. It
// deliberately has no ReadFrom, so that every body byte goes through
// Write.
type Writer struct {
	http.ResponseWriter
	obs []Observer
	// scrub edits the header before any status is written (SetScrub).
	scrub func(http.Header)

	// The write deadline (SetWriteTimeout).
	writeTimeout time.Duration
	bound        Bound // what may bound the writes already (SetWriteTimeout)
	onTimeout    func()
	// armedAt is when the deadline was last pushed, since monoBase plus
	// one; 0: never.
	armedAt time.Duration

	status int32
	tail   [2]byte // the last two body bytes written
	flags  uint8   // started, responded, ... below

	// owner is the caller's per-request state (SetOwner).
	owner any
}

// Writer.flags' bits.
const (
	flagStarted   = 1 << iota // body bytes were written
	flagResponded             // a final status or 101 was written
	flagTimedOut              // a write or flush hit the write deadline
	flagFlushed               // a flush was asked for (a stream)
	flagUnflushed             // body bytes were written since the last flush
)

// monoBase is the origin of Writer.armedAt: a duration since it reads the
// monotonic clock only, in 8 bytes where a time.Time takes 24.
var monoBase = time.Now()

// NewWriter wraps w, feeding obs.
func NewWriter(w http.ResponseWriter, obs ...Observer) *Writer {
	return &Writer{ResponseWriter: w, obs: obs}
}

// Init sets up w, a Writer the caller keeps (for example inside its own
// per-request state, so that observing a response costs no allocation of
// its own), to wrap rw and feed obs, as NewWriter does.
func (w *Writer) Init(rw http.ResponseWriter, obs []Observer) {
	*w = Writer{ResponseWriter: rw, obs: obs}
}

// SetWriteTimeout bounds every write and flush to the client: one that
// makes no progress for d (a client that stopped reading a stream while
// the socket buffers are full) fails with a timeout, so that the handler
// writing (reverse_proxy) gives up instead of blocking its goroutine for
// as long as the client keeps the connection open. The connection's write
// deadline is pushed to now+d before a write or flush when more than d/8
// passed since the last push, so a write may time out after 7/8 d of no
// progress at the earliest; it is lifted again when Serve ends. onTimeout
// (may be nil) runs once, on the first write or flush that timed out. Where
// the connection takes no deadline (a writer hiding it) nothing is
// bounded. It replaces the server's own write timeout, if any, for the
// rest of the response, unless b (may be nil) reports that the server
// bounds every write and flush by at most d itself (Caddy's write idle
// timeout, pushed before each of them): then the Writer sets no deadline
// of its own (two fewer per response) and only notes a write that timed
// out.
func (w *Writer) SetWriteTimeout(d time.Duration, onTimeout func(), b Bound) {
	w.writeTimeout, w.onTimeout, w.bound = d, onTimeout, b
}

// Bound is the b SetWriteTimeout was last given, nil when it was not
// called since Init: a handler that sets up w can look the server's bound
// up once for the handlers behind it that adopt w.
func (w *Writer) Bound() Bound { return w.bound }

// Bound reports whether every write and flush below a Writer is already
// bounded by at most d without progress (SetWriteTimeout). It is asked
// before each write or flush until the Writer sets a deadline of its own.
type Bound interface{ Bounds(d time.Duration) bool }

// WriteTimedOut reports that a write or flush hit the write deadline.
func (w *Writer) WriteTimedOut() bool { return w.flags&flagTimedOut != 0 }

// armWrite pushes the write deadline before a write or flush.
func (w *Writer) armWrite() {
	if w.writeTimeout <= 0 || (w.armedAt == 0 && w.bound != nil && w.bound.Bounds(w.writeTimeout)) {
		return
	}
	// The check reads the monotonic clock only (time.Since); time.Now,
	// which reads the wall clock too, only when the deadline is pushed.
	if w.armedAt != 0 && time.Since(monoBase)+1-w.armedAt < w.writeTimeout/8 {
		return
	}
	now := time.Now()
	if http.NewResponseController(w.ResponseWriter).SetWriteDeadline(now.Add(w.writeTimeout)) != nil {
		w.writeTimeout = 0 // the connection takes no deadline: stop trying
		return
	}
	w.armedAt = now.Sub(monoBase) + 1
}

// wrote notes a write or flush error that is the write deadline's.
func (w *Writer) wrote(err error) {
	if err == nil || w.writeTimeout <= 0 || w.flags&flagTimedOut != 0 {
		return
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		w.flags |= flagTimedOut
		if w.onTimeout != nil {
			w.onTimeout()
		}
	}
}

// disarm lifts the write deadline at the end of the response, so that it
// does not outlive it on a kept-alive connection. A stream is flushed
// first, under the deadline, so that only the server's few closing bytes
// (the last chunk) are written without it; not when nothing was written
// since its last flush (reverse_proxy with flush_interval -1 flushes after
// every write), which would flush nothing.
func (w *Writer) disarm() {
	if w.armedAt == 0 || w.flags&flagTimedOut != 0 {
		return
	}
	if w.flags&(flagFlushed|flagUnflushed) == flagFlushed|flagUnflushed {
		_ = w.FlushError()
		if w.flags&flagTimedOut != 0 {
			return
		}
	}
	_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Time{})
	w.armedAt = 0
}

// Status is the final status written, 0 when none yet.
func (w *Writer) Status() int { return int(w.status) }

// SetScrub has scrub edit the response header before each status is
// written (1xx included; before the observers see it) and drops a final
// status written after the first: the edge's duties (ramjet_guard), so
// that a guard behind a Writer needs no writer of its own. It reports
// false, setting nothing, when w scrubs already or has responded.
func (w *Writer) SetScrub(scrub func(http.Header)) bool {
	if w.scrub != nil || w.flags&flagResponded != 0 {
		return false
	}
	w.scrub = scrub
	return true
}

// Adopt has w, a writer with no observers (a guard's: SetScrub), feed obs
// from now on, so that one writer serves both; it reports false, setting
// nothing, when w has observers or has responded.
func (w *Writer) Adopt(obs []Observer) bool {
	if w.obs != nil || w.flags&flagResponded != 0 || w.status != 0 {
		return false
	}
	w.obs = obs
	return true
}

// SetOwner records v, the per-request state of the handler that set w up,
// so that the handlers and the selection policy further down the chain,
// which are handed w, find it there (Owner) instead of looking it up in
// the request's context. Init clears it.
func (w *Writer) SetOwner(v any) { w.owner = v }

// Owner is what SetOwner recorded, nil when nothing was.
func (w *Writer) Owner() any { return w.owner }

// Responded reports that a final status (or 101) was written.
func (w *Writer) Responded() bool { return w.flags&flagResponded != 0 }

// WriteHeader tells the observers the first final (non-1xx) status, then
// writes it.
func (w *Writer) WriteHeader(status int) {
	final := status >= 200 || status == http.StatusSwitchingProtocols
	if w.scrub != nil {
		if final && w.flags&flagResponded != 0 {
			return
		}
		w.scrub(w.Header())
	}
	if final {
		w.flags |= flagResponded
	}
	if w.status == 0 && status >= 200 {
		w.status = int32(status)
		h := w.Header() // one map for every observer: one call below, not one each
		for _, o := range w.obs {
			o.WriteHeader(status, h)
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *Writer) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) > 0 {
		w.flags |= flagStarted
	}
	for _, o := range w.obs {
		o.Write(p)
	}
	if n := len(p); n >= 2 {
		w.tail = [2]byte{p[n-2], p[n-1]}
	} else if n == 1 {
		w.tail = [2]byte{w.tail[1], p[0]}
	}
	w.armWrite()
	w.flags |= flagUnflushed
	n, err := w.ResponseWriter.Write(p)
	if err != nil { // wrote has nothing to note without an error: no call
		w.wrote(err)
	}
	return n, err
}

// End tells the observers that the response ended with err, and detaches
// them and the write deadline: what is written after (a guard's error
// answer, Adopt) goes through unobserved, as through the writer below.
func (w *Writer) End(err error) {
	for _, o := range w.obs {
		o.End(int(w.status), err)
	}
	w.obs, w.writeTimeout = nil, 0
}

// Flush sends buffered data to the client now (SSE).
func (w *Writer) Flush() { _ = w.FlushError() }

// FlushError is Flush reporting errors (http.ResponseController).
func (w *Writer) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.flags = w.flags&^flagUnflushed | flagFlushed
	w.armWrite()
	err := http.NewResponseController(w.ResponseWriter).Flush()
	w.wrote(err)
	return err
}

// complete sends a whole answer of declared length to an HTTP/1.x client
// now, before the observers' End and done run, rather than when the
// handler chain returns: net/http sends what is buffered only then, so the
// end's accounting would be on the client's path. Only when body bytes
// wait unflushed (reverse_proxy with flush_interval -1 flushed them
// already) and the header declares Content-Length (without it net/http
// would switch to chunked; with it the bytes on the wire are the same).
// Not for HTTP/2 and 3, where a flush does not end the stream.
func (w *Writer) complete(r *http.Request) {
	if w.flags&(flagUnflushed|flagTimedOut) == flagUnflushed && r.ProtoMajor == 1 && w.Header()["Content-Length"] != nil {
		_ = w.FlushError()
	}
}

// Hijack passes connection hijacking (websockets) through.
func (w *Writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// StreamError writes event (a complete SSE event) when the response is an
// SSE stream whose body has started (a stream that never started is
// answered with an error status instead), and flushes it. Blank lines
// first end an event the engine left half-written. The observers do not
// see it.
func (w *Writer) StreamError(event []byte) {
	if w.flags&flagStarted == 0 || w.flags&flagTimedOut != 0 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
		return
	}
	if w.tail != [2]byte{'\n', '\n'} {
		if _, err := w.ResponseWriter.Write([]byte("\n\n")); err != nil {
			return
		}
	}
	if _, err := w.ResponseWriter.Write(event); err != nil {
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap returns the wrapped writer (http.ResponseController).
func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Interface guards.
var (
	_ http.Flusher  = (*Writer)(nil)
	_ http.Hijacker = (*Writer)(nil)
)

// Handler is the next handler of a middleware (caddyhttp.Handler's method
// set).
type Handler interface {
	ServeHTTP(http.ResponseWriter, *http.Request) error
}

// Serve calls next with w wrapped in a Writer feeding obs, then ends the
// observers with next's error and runs done. A handler that aborts a
// response it cannot finish (reverse_proxy does, with
// panic(http.ErrAbortHandler), when the client or the upstream went away
// mid-body) ends the observers with http.ErrAbortHandler and runs done all
// the same, and the panic goes on; a stream the client still reads first
// gets cut (StreamError), so that SDKs report an error rather than a
// silent end.
func Serve(w http.ResponseWriter, r *http.Request, next Handler, cut []byte, done func(), obs ...Observer) error {
	return NewWriter(w, obs...).Serve(r, next, cut, doneFunc(done))
}

// Doner is what runs once a response served by Writer.Serve ended.
type Doner interface{ ResponseDone() }

type doneFunc func()

func (f doneFunc) ResponseDone() { f() }

// Serve is the package's Serve with rw as the Writer (set up by Init) and
// done's ResponseDone as what runs at the end (an interface, so that a
// caller's per-request state can be it without a method value's
// allocation).
func (rw *Writer) Serve(r *http.Request, next Handler, cut []byte, done Doner) error {
	ended := false
	defer func() {
		if !ended {
			if r.Context().Err() == nil {
				rw.StreamError(cut)
			}
			rw.disarm()
			rw.End(http.ErrAbortHandler)
			done.ResponseDone()
		}
	}()
	err := next.ServeHTTP(rw, r)
	ended = true
	if err == nil {
		rw.complete(r)
	}
	rw.disarm()
	rw.End(err)
	done.ResponseDone()
	return err
}
