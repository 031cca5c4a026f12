package observe

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// recorder records what a Writer fed it.
type recorder struct {
	status int
	body   []byte
	ended  int
	endErr error
}

func (o *recorder) WriteHeader(status int, h http.Header) {
	o.status = status
	h.Set("X-Seen", "1") // the header is still writable
}
func (o *recorder) Write(p []byte) { o.body = append(o.body, p...) }
func (o *recorder) End(status int, err error) {
	o.ended, o.endErr = status, err
}

func TestWriterFeedsObservers(t *testing.T) {
	rec := httptest.NewRecorder()
	a, b := &recorder{}, &recorder{}
	w := NewWriter(rec, a, b)
	if w.Status() != 0 {
		t.Fatalf("status %d before any write", w.Status())
	}
	w.Write([]byte("hello "))
	w.WriteHeader(http.StatusTeapot) // too late: the first final status stays
	if err := http.NewResponseController(w).Flush(); err != nil {
		t.Fatalf("flush through the writer: %v", err)
	}
	w.Write([]byte("world"))
	want := errors.New("next failed")
	w.End(want)
	for _, o := range []*recorder{a, b} {
		if o.status != 200 || string(o.body) != "hello world" || o.ended != 200 || o.endErr != want {
			t.Errorf("observer saw %+v", o)
		}
	}
	if !rec.Flushed || rec.Body.String() != "hello world" || rec.Result().Header.Get("X-Seen") != "1" {
		t.Errorf("client got flushed=%v %q, X-Seen %q", rec.Flushed, rec.Body.String(), rec.Result().Header.Get("X-Seen"))
	}
}

func TestWriterStreamError(t *testing.T) {
	const event = "event: error\ndata: {}\n\n"
	tests := []struct {
		name   string
		ctype  string
		chunks []string
		want   string
	}{
		{name: "cut mid-event", ctype: "text/event-stream", chunks: []string{"data: {\"x\":"}, want: "data: {\"x\":\n\n" + event},
		{name: "cut between events", ctype: "text/event-stream", chunks: []string{"data: {}\n", "\n"}, want: "data: {}\n\n" + event},
		{name: "not started", ctype: "text/event-stream", want: ""},
		{name: "not a stream", ctype: "application/json", chunks: []string{"{"}, want: "{"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			o := &recorder{}
			w := NewWriter(rec, o)
			w.Header().Set("Content-Type", tt.ctype)
			for _, c := range tt.chunks {
				w.Write([]byte(c))
			}
			w.StreamError([]byte(event))
			if got := rec.Body.String(); got != tt.want {
				t.Errorf("client got %q, want %q", got, tt.want)
			}
			if want := strings.Join(tt.chunks, ""); string(o.body) != want {
				t.Errorf("observer saw %q, want only the body %q", o.body, want)
			}
		})
	}
}

type handlerFunc func(http.ResponseWriter, *http.Request) error

func (f handlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) error { return f(w, r) }

// TestServeAbort: a handler that aborts mid-stream still ends the
// observers and runs done, the client gets the cut event, and the panic
// goes on.
func TestServeAbort(t *testing.T) {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	o := &recorder{}
	done := 0
	next := handlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: {}\n\n"))
		panic(http.ErrAbortHandler)
	})
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("recovered %v, want the abort panic", v)
			}
		}()
		_ = Serve(rec, r, next, []byte("event: error\n\n"), func() { done++ }, o)
	}()
	if o.endErr != http.ErrAbortHandler || o.ended != 200 || done != 1 {
		t.Errorf("observer %+v, done %d", o, done)
	}
	if got := rec.Body.String(); got != "data: {}\n\nevent: error\n\n" {
		t.Errorf("client got %q", got)
	}
	want := errors.New("next failed")
	done = 0
	err := Serve(httptest.NewRecorder(), r, handlerFunc(func(http.ResponseWriter, *http.Request) error { return want }), nil, func() { done++ }, o)
	if err != want || o.endErr != want || done != 1 {
		t.Errorf("Serve = %v, observer %+v, done %d", err, o, done)
	}
}

// flushCounter is a ResponseWriter that takes deadlines and counts
// flushes and the write deadlines set.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes   int
	deadlines []time.Time
}

func (f *flushCounter) Flush() { f.flushes++; f.ResponseRecorder.Flush() }
func (f *flushCounter) SetWriteDeadline(t time.Time) error {
	f.deadlines = append(f.deadlines, t)
	return nil
}

// TestWriterDisarmFlushesOnlyUnflushed: at the end of a response under a
// write timeout, the writer flushes once more only when body bytes were
// written after the last flush, and lifts the deadline in either case.
func TestWriterDisarmFlushesOnlyUnflushed(t *testing.T) {
	for _, tt := range []struct {
		name    string
		steps   string // w: write, f: flush
		flushes int
	}{
		{"write then flush", "wf", 1},
		{"flush after every write", "wfwf", 2},
		{"write after the last flush", "wfw", 2},
		{"no flush", "ww", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rw := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
			var w Writer
			w.Init(rw, nil)
			w.SetWriteTimeout(time.Minute, nil, nil)
			next := handlerFunc(func(hw http.ResponseWriter, _ *http.Request) error {
				for _, c := range tt.steps {
					if c == 'w' {
						_, _ = hw.Write([]byte("x"))
					} else {
						_ = http.NewResponseController(hw).Flush()
					}
				}
				return nil
			})
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			if err := w.Serve(r, next, nil, doneFunc(func() {})); err != nil {
				t.Fatal(err)
			}
			if rw.flushes != tt.flushes {
				t.Errorf("%d flushes, want %d", rw.flushes, tt.flushes)
			}
			if n := len(rw.deadlines); n == 0 || !rw.deadlines[n-1].IsZero() {
				t.Errorf("write deadlines %v: the last one is not lifted", rw.deadlines)
			}
		})
	}
}

// boundBy is a Bound: the server bounds every write by at most its
// duration (0: not at all).
type boundBy time.Duration

func (b boundBy) Bounds(d time.Duration) bool { return b > 0 && time.Duration(b) <= d }

// TestWriterBound: a Writer whose writes the server already bounds by at
// most its write timeout sets no deadline of its own, yet still notes a
// write that timed out; one bounded more loosely, or not at all, sets
// and lifts its own as before.
func TestWriterBound(t *testing.T) {
	for _, tt := range []struct {
		name      string
		bound     Bound
		deadlines bool
	}{
		{"no bound", nil, true},
		{"server bounds tighter", boundBy(30 * time.Second), false},
		{"server bounds the same", boundBy(time.Minute), false},
		{"server bounds looser", boundBy(2 * time.Minute), true},
		{"server does not bound", boundBy(0), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rw := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
			var w Writer
			w.Init(rw, nil)
			if w.Bound() != nil {
				t.Fatal("Bound() after Init is not nil")
			}
			w.SetWriteTimeout(time.Minute, nil, tt.bound)
			if w.Bound() != tt.bound {
				t.Errorf("Bound() = %v, want %v", w.Bound(), tt.bound)
			}
			next := handlerFunc(func(hw http.ResponseWriter, _ *http.Request) error {
				_, _ = hw.Write([]byte("x"))
				return http.NewResponseController(hw).Flush()
			})
			if err := w.Serve(httptest.NewRequest(http.MethodGet, "/", nil), next, nil, doneFunc(func() {})); err != nil {
				t.Fatal(err)
			}
			if got := len(rw.deadlines) > 0; got != tt.deadlines {
				t.Errorf("write deadlines %v, want some: %v", rw.deadlines, tt.deadlines)
			}
			if n := len(rw.deadlines); n > 0 && !rw.deadlines[n-1].IsZero() {
				t.Errorf("write deadlines %v: the last one is not lifted", rw.deadlines)
			}
		})
	}
	// A write that times out under the server's bound is noted as the
	// Writer's own would be.
	var cuts int
	var w Writer
	w.Init(timeoutWriter{httptest.NewRecorder()}, nil)
	w.SetWriteTimeout(time.Minute, func() { cuts++ }, boundBy(time.Second))
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("the write did not fail")
	}
	if !w.WriteTimedOut() || cuts != 1 {
		t.Errorf("timed out %v, %d cuts; want true, 1", w.WriteTimedOut(), cuts)
	}
}

// timeoutWriter fails every write with a timeout, as a connection past
// its write deadline does.
type timeoutWriter struct{ *httptest.ResponseRecorder }

func (timeoutWriter) Write([]byte) (int, error) { return 0, os.ErrDeadlineExceeded }

// gate is an observer whose End waits until the client has read the whole
// answer (or fails the test after a long wait): an end's accounting that
// the client's answer would wait for.
type gate struct {
	t    *testing.T
	read chan struct{}
}

func (g *gate) WriteHeader(int, http.Header) {}
func (g *gate) Write([]byte)                 {}
func (g *gate) End(int, error) {
	select {
	case <-g.read:
	case <-time.After(20 * time.Second):
		g.t.Error("the client did not receive the answer before the end's accounting")
	}
}

// TestServeCompletesBeforeEnd: an answer of declared length reaches an
// HTTP/1.1 client before the observers' End runs (Writer.complete), with
// the same bytes on the wire; an answer without Content-Length is not
// flushed early (net/http adds the length at the handler's end instead of
// chunking it); a HEAD's answer (no body written) is unchanged.
func TestServeCompletesBeforeEnd(t *testing.T) {
	const body = `{"ok":true}`
	tests := []struct {
		name     string
		method   string
		declared bool // the handler sets Content-Length
		early    bool // the client has the answer before End
	}{
		{"declared length", "POST", true, true},
		{"no length", "POST", false, false},
		{"HEAD", "HEAD", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &gate{t: t, read: make(chan struct{}, 1)} // buffered: a failed wait does not hang the client side
			next := handlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				w.Header().Set("Content-Type", "application/json")
				if tt.declared {
					w.Header().Set("Content-Length", "11")
				}
				if r.Method != "HEAD" {
					_, _ = w.Write([]byte(body))
				}
				return nil
			})
			ends := make(chan struct{}, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var obs []Observer
				if tt.early {
					obs = append(obs, g)
				}
				_ = Serve(w, r, next, nil, func() { ends <- struct{}{} }, obs...)
			}))
			defer srv.Close()
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			for range 2 { // the connection stays usable for a second request
				fmt.Fprintf(conn, "%s / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", tt.method)
				resp, err := http.ReadResponse(br, &http.Request{Method: tt.method})
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				if tt.early {
					g.read <- struct{}{}
				}
				<-ends
				want := body
				if tt.method == "HEAD" {
					want = ""
				}
				if string(got) != want || resp.ContentLength != 11 || len(resp.TransferEncoding) != 0 || resp.Close {
					t.Errorf("got %q, length %d, transfer encoding %v, close %v; want %q, 11, none, false",
						got, resp.ContentLength, resp.TransferEncoding, resp.Close, want)
				}
			}
		})
	}
}

// TestServeCompleteOnlyHTTP1: the early flush of a declared-length answer
// is HTTP/1.x's only; over HTTP/2 (and 3) a flush would send the frames
// without ending the stream, so nothing is flushed before the handler
// returns.
func TestServeCompleteOnlyHTTP1(t *testing.T) {
	for _, tt := range []struct {
		major     int
		wantFlush bool
	}{{1, true}, {2, false}, {3, false}} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", nil)
		r.ProtoMajor = tt.major
		next := handlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("Content-Length", "2")
			_, _ = w.Write([]byte("ok"))
			return nil
		})
		if err := Serve(rec, r, next, nil, func() {}); err != nil {
			t.Fatal(err)
		}
		if rec.Flushed != tt.wantFlush {
			t.Errorf("HTTP/%d: flushed %v, want %v", tt.major, rec.Flushed, tt.wantFlush)
		}
	}
}
