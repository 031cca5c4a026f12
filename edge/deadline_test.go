package edge

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// readResult is what a test handler saw reading its body.
type readResult struct {
	n    int
	err  error
	none bool
	took time.Duration
}

// deadlineServer serves each request by reading its body under
// BodyDeadline(d, minRate) and reports what it read.
func deadlineServer(t *testing.T, d time.Duration, minRate int64) (*httptest.Server, chan readResult) {
	t.Helper()
	got := make(chan readResult, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		none := BodyDeadline(w, r, d, minRate)
		b, err := io.ReadAll(r.Body)
		if !none {
			LiftBodyDeadline(w)
		}
		got <- readResult{n: len(b), err: err, none: none, took: time.Since(start)}
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// trickle sends a request promising size body bytes and then one byte
// every gap until the server stops reading (or size bytes went out).
func trickle(t *testing.T, addr string, size int, gap time.Duration) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size); err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := 0; i < size; i++ {
			if _, err := c.Write([]byte{'x'}); err != nil {
				return
			}
			time.Sleep(gap) // the client's pace, not synchronisation
		}
	}()
}

func TestBodyDeadlineMinRate(t *testing.T) {
	srv, got := deadlineServer(t, time.Minute, 1000)
	trickle(t, strings.TrimPrefix(srv.URL, "http://"), 4096, 50*time.Millisecond)
	res := <-got
	if res.none {
		t.Fatal("BodyDeadline set no deadline on an HTTP/1.1 connection")
	}
	if !BodyTimedOut(res.err) {
		t.Fatalf("read ended with %v after %d bytes, want a timeout", res.err, res.n)
	}
	if res.took < MinRateGrace {
		t.Errorf("cut after %v, within the %v grace", res.took, MinRateGrace)
	}
	if res.took > 30*time.Second {
		t.Errorf("cut after %v: the minimum rate did not apply before the total deadline", res.took)
	}
	if e := BodyTimeout(); e.Status != http.StatusRequestTimeout || e.Code == nil || *e.Code != "request_timeout" {
		t.Errorf("BodyTimeout() = %+v, want a 408 request_timeout", e)
	}
}

func TestBodyDeadlineTotal(t *testing.T) {
	srv, got := deadlineServer(t, 300*time.Millisecond, 0)
	trickle(t, strings.TrimPrefix(srv.URL, "http://"), 4096, 50*time.Millisecond)
	res := <-got
	if !BodyTimedOut(res.err) || res.took < 300*time.Millisecond {
		t.Fatalf("read ended with %v after %v, want a timeout after 300ms", res.err, res.took)
	}
}

// TestBodyDeadlineFastBody: a body sent at once is read whole under both
// deadlines, and the lifted deadline leaves the connection usable for the
// next request.
func TestBodyDeadlineFastBody(t *testing.T) {
	srv, got := deadlineServer(t, 10*time.Second, 1000)
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	body := strings.Repeat("y", 64<<10)
	for i := 0; i < 2; i++ {
		if _, err := fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		res := <-got
		if res.err != nil || res.n != len(body) || res.none {
			t.Fatalf("request %d: read %d bytes, error %v, none %v; want %d bytes", i, res.n, res.err, res.none, len(body))
		}
	}
}

func TestBodyDeadlineNone(t *testing.T) {
	w := httptest.NewRecorder()
	tests := []struct {
		name    string
		body    io.Reader
		d       time.Duration
		minRate int64
	}{
		{name: "no body", d: time.Second},
		{name: "no limits", body: strings.NewReader("x")},
		{name: "no deadline on the writer", body: strings.NewReader("x"), d: time.Second, minRate: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", tt.body)
			if tt.body == nil {
				r.Body = http.NoBody
			}
			orig := r.Body
			if !BodyDeadline(w, r, tt.d, tt.minRate) {
				t.Error("BodyDeadline reported a deadline to lift")
			}
			if r.Body != orig {
				t.Error("BodyDeadline wrapped the body without a deadline")
			}
		})
	}
	for _, err := range []error{nil, io.EOF, errors.New("x"), ErrTooLarge} {
		if BodyTimedOut(err) {
			t.Errorf("BodyTimedOut(%v) = true", err)
		}
	}
}

// readDeadlines is a ResponseWriter that records the read deadlines set
// through it.
type readDeadlines struct {
	*httptest.ResponseRecorder
	set []time.Time
}

func (w *readDeadlines) SetReadDeadline(t time.Time) error {
	w.set = append(w.set, t)
	return nil
}

// TestDeferredDeadline: a body read in one read gets no deadline; one
// that takes more reads gets the start plus d before its second, lifted
// by Lift; reads after Lift set none.
func TestDeferredDeadline(t *testing.T) {
	for _, tt := range []struct {
		name  string
		body  io.Reader
		reads int // deadlines set: one when a second read happens
	}{
		{"one read", &eofWithData{s: "hello"}, 0},
		{"several reads", io.MultiReader(strings.NewReader("hel"), strings.NewReader("lo")), 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := &readDeadlines{ResponseRecorder: httptest.NewRecorder()}
			r := httptest.NewRequest(http.MethodPost, "/", tt.body)
			var dl DeferredDeadline
			before := time.Now()
			dl.Defer(w, r, time.Minute)
			buf := make([]byte, 16)
			n, err := r.Body.Read(buf)
			for err == nil {
				var m int
				m, err = r.Body.Read(buf[n:])
				n += m
			}
			if string(buf[:n]) != "hello" {
				t.Fatalf("read %q", buf[:n])
			}
			if len(w.set) != tt.reads {
				t.Fatalf("deadlines %v, want %d", w.set, tt.reads)
			}
			if tt.reads > 0 && (w.set[0].Before(before.Add(time.Minute)) || w.set[0].After(time.Now().Add(time.Minute))) {
				t.Errorf("deadline %v, want the start plus 1m", w.set[0])
			}
			dl.Lift()
			if want := 2 * tt.reads; len(w.set) != want || (want > 0 && !w.set[1].IsZero()) {
				t.Errorf("deadlines after Lift %v, want the first lifted", w.set)
			}
			dl.reads = 1
			_, _ = r.Body.Read(buf)
			if len(w.set) != 2*tt.reads {
				t.Errorf("a read after Lift set a deadline: %v", w.set)
			}
		})
	}
}

// eofWithData returns its bytes with io.EOF in one read, as net/http's
// body of a known length does with its last bytes.
type eofWithData struct{ s string }

func (r *eofWithData) Read(p []byte) (int, error) {
	n := copy(p, r.s)
	r.s = r.s[n:]
	if r.s == "" {
		return n, io.EOF
	}
	return n, nil
}

// TestDeferredDeadlineTotal: a trickled body read under a deferred
// deadline times out at the start plus d, as under BodyDeadline.
func TestDeferredDeadlineTotal(t *testing.T) {
	got := make(chan readResult, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var dl DeferredDeadline
		dl.Defer(w, r, 300*time.Millisecond)
		b, err := io.ReadAll(r.Body)
		dl.Lift()
		got <- readResult{n: len(b), err: err, took: time.Since(start)}
	}))
	t.Cleanup(srv.Close)
	trickle(t, strings.TrimPrefix(srv.URL, "http://"), 4096, 50*time.Millisecond)
	res := <-got
	if !BodyTimedOut(res.err) || res.took < 300*time.Millisecond {
		t.Fatalf("read ended with %v after %v, want a timeout after 300ms", res.err, res.took)
	}
}
