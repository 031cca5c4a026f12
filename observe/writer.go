package observe

import (
	"bufio"
	"net"
	"net/http"
	"strings"
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
	obs     []Observer
	status  int
	started bool
	tail    [2]byte // the last two body bytes written
}

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

// Status is the final status written, 0 when none yet.
func (w *Writer) Status() int { return w.status }

// WriteHeader tells the observers the first final (non-1xx) status, then
// writes it.
func (w *Writer) WriteHeader(status int) {
	if w.status == 0 && status >= 200 {
		w.status = status
		for _, o := range w.obs {
			o.WriteHeader(status, w.Header())
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *Writer) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) > 0 {
		w.started = true
	}
	for _, o := range w.obs {
		o.Write(p)
	}
	if n := len(p); n >= 2 {
		w.tail = [2]byte{p[n-2], p[n-1]}
	} else if n == 1 {
		w.tail = [2]byte{w.tail[1], p[0]}
	}
	return w.ResponseWriter.Write(p)
}

// End tells the observers that the response ended with err.
func (w *Writer) End(err error) {
	for _, o := range w.obs {
		o.End(w.status, err)
	}
}

// Flush sends buffered data to the client now (SSE).
func (w *Writer) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// FlushError is Flush reporting errors (http.ResponseController).
func (w *Writer) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
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
	if !w.started || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
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
			rw.End(http.ErrAbortHandler)
			done.ResponseDone()
		}
	}()
	err := next.ServeHTTP(rw, r)
	ended = true
	rw.End(err)
	done.ResponseDone()
	return err
}
