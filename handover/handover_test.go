package handover

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// eventually polls cond every 10ms until it holds, and fails the test
// after 20s (generous: the suite must pass on a loaded machine; a passing
// condition returns at once).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// socket binds 127.0.0.1:0 for the test.
func socket(t *testing.T) net.Listener {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	return inner
}

// dialAccept connects a client to inner and returns it with the
// connection ln's server accepted.
func dialAccept(t *testing.T, inner, ln net.Listener) (client, sc net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	if sc, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	return client, sc
}

// keepOpenListener is a listener whose Close leaves the socket open, as
// Caddy's listener pool does for the servers of an old config.
type keepOpenListener struct{ net.Listener }

func (keepOpenListener) Close() error { return nil }

// TestHandoverCloseBeforeListenerClose: net/http's Shutdown marks the
// server as shutting down before it closes its listener, and a connection
// that finishes a response in between is closed at once, without
// "Connection: close". With a newer server on the socket (a reload), the
// connection waits for the old listener to close and moves to the new
// server, so the client's next request is answered there.
func TestHandoverCloseBeforeListenerClose(t *testing.T) {
	inner := socket(t)
	var h Handover
	old := h.WrapListener(keepOpenListener{inner})
	defer old.Close()
	client, sc := dialAccept(t, inner, old)
	c := sc.(*handoverConn)
	// The old server answers a request and reaches the boundary.
	if _, err := c.Write([]byte("answer 1\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.SetWriteDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(client)
	if line, err := br.ReadString('\n'); err != nil || line != "answer 1\n" {
		t.Fatalf("first answer: %q, %v", line, err)
	}
	// The reload: the new server is on the socket, the old one begins its
	// shutdown and closes the idle connection before its listener.
	next := h.WrapListener(keepOpenListener{inner})
	defer next.Close()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	var closeErr error
	closeReturned := false
	eventually(t, "the old server's close to wait for its listener or return", func() bool {
		select {
		case closeErr = <-closed:
			closeReturned = true
			return true
		default:
		}
		if c.mu.TryLock() {
			c.mu.Unlock()
			return false
		}
		return true // Close holds the connection while it waits
	})
	if closeReturned {
		t.Fatalf("the old server's close (%v) did not wait for its listener: the connection is gone under its client", closeErr)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write([]byte("request 2\n")); err != nil {
		t.Fatal(err)
	}
	nc, err := next.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := <-closed; err != nil {
		t.Fatalf("old server's close: %v", err)
	}
	got, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil || got != "request 2\n" {
		t.Fatalf("new server read %q, %v; want the client's next request", got, err)
	}
	if _, err := nc.Write([]byte("answer 2\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "answer 2\n" {
		t.Fatalf("second answer: %q, %v", line, err)
	}
}

// TestHandoverCloseWithoutReload: with no newer server on the socket, a
// close is a close: the client sees EOF at once.
func TestHandoverCloseWithoutReload(t *testing.T) {
	inner := socket(t)
	var h Handover
	ln := h.WrapListener(keepOpenListener{inner})
	defer ln.Close()
	client, sc := dialAccept(t, inner, ln)
	if _, err := sc.Write([]byte("answer\n")); err != nil {
		t.Fatal(err)
	}
	if err := sc.SetWriteDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := sc.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(client)
	if err != nil || string(b) != "answer\n" {
		t.Fatalf("client read %q, %v; want the answer then EOF", b, err)
	}
}

// TestHandoverUnmarshalCaddyfile: the Caddyfile form, its one option and
// the mistakes it refuses.
func TestHandoverUnmarshalCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		want    Handover
		wantErr string
	}{
		{name: "bare", give: "ramjet_handover"},
		{name: "timeout", give: "ramjet_handover {\n handshake_timeout 3s\n}", want: Handover{HandshakeTimeout: caddy.Duration(3 * time.Second)}},
		{name: "argument", give: "ramjet_handover on", wantErr: "wrong argument count"},
		{name: "zero is the default", give: "ramjet_handover {\n handshake_timeout 0\n}"},
		{name: "unknown", give: "ramjet_handover {\n idle 3s\n}", wantErr: "ramjet_handover: unrecognized option 'idle'"},
		{name: "duplicate", give: "ramjet_handover {\n handshake_timeout 3s\n handshake_timeout 4s\n}", wantErr: "ramjet_handover: handshake_timeout specified more than once"},
		{name: "bad duration", give: "ramjet_handover {\n handshake_timeout soon\n}", wantErr: `handshake_timeout: "soon" is not a positive duration`},
		{name: "negative", give: "ramjet_handover {\n handshake_timeout -1s\n}", wantErr: `handshake_timeout: "-1s" is not a positive duration`},
		{name: "missing value", give: "ramjet_handover {\n handshake_timeout\n}", wantErr: "handshake_timeout: missing value"},
		{name: "too many values", give: "ramjet_handover {\n handshake_timeout 1s 2s\n}", wantErr: "handshake_timeout: too many values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Handover
			err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if err := (&Handover{HandshakeTimeout: -1}).Validate(); err == nil {
		t.Error("a negative handshake_timeout validated")
	}
}

// TestHandoverNeverMovesH2C: a connection that opened with the HTTP/2
// preface (h2c with prior knowledge) is closed at a shutdown, never handed
// to the next server, which would read HTTP/2 frames as HTTP/1.1 (its
// shutdown sent GOAWAY, which the client acts on).
func TestHandoverNeverMovesH2C(t *testing.T) {
	inner := socket(t)
	var h Handover
	old := h.WrapListener(keepOpenListener{inner})
	next := h.WrapListener(keepOpenListener{inner})
	defer next.Close()
	client, sc := dialAccept(t, inner, old) // next's accept loop is not started: old takes it
	if _, err := io.WriteString(client, h2Preface); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if n, err := io.ReadAtLeast(sc, buf, len(h2Preface)); err != nil || string(buf[:n]) != h2Preface {
		t.Fatalf("server read %q, %v", buf[:n], err)
	}
	if err := sc.SetWriteDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- sc.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the h2c connection's close waits for the next server to take it")
	}
	_ = client.SetReadDeadline(time.Now().Add(20 * time.Second))
	if b, err := io.ReadAll(client); err != nil || len(b) != 0 {
		t.Fatalf("client read %q, %v; want EOF", b, err)
	}
}
