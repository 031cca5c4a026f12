package handover

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// h2Preface opens every HTTP/2 connection.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// maxReplay bounds the bytes of a request kept for a replay on the next
// server: net/http reads a request's head (at most the server's header
// limit plus one buffer) before it drops a request that arrived during
// its shutdown.
const maxReplay = 1<<20 + 64<<10

// handoverConn is a server's view of one HTTP/1.1 connection (a plain
// socket, or a *tls.Conn whose handshake is done: its Reads and Writes are
// the plain text either way). It tracks
// what the server read since its last response, so that at a shutdown it
// knows whether the connection can move to the next server without losing
// a byte:
//
//   - after the last response byte, net/http's background read (one-byte
//     reads) may hold the first byte of the next request (peeked), or the
//     server drains an unread request body (bulkBefore: never moved);
//   - net/http then clears the write deadline (the boundary); whatever it
//     reads from there on is the next request (seq), which a server
//     shutting down drops unanswered; the next server reads it again.
type handoverConn struct {
	net.Conn
	ln *handoverListener

	mu         sync.Mutex
	idle       *sync.Cond // signalled when a Read returns
	reading    bool       // a Read is in the underlying connection
	gone       bool       // handed over or closed: this view is done
	tainted    bool       // a Read or Write failed, the write side closed, or h2c
	read       bool       // anything was read on this connection (by any server)
	boundary   bool       // past the end of the last response's handling
	peeked     []byte     // one-byte reads between the last Write and the boundary
	bulkBefore bool       // other reads there (a drained request body)
	seq        []byte     // bytes read since the boundary
	over       bool       // seq outgrew maxReplay
	prefix     []byte     // bytes for this view to serve before the socket's
	carry      []byte     // bytes read after the handover began
}

// newHandoverConn is ln's server's view of conn, which serves prefix
// before conn's own bytes: a *handoverConn, or a *tlsHandoverConn when conn
// is a *tls.Conn.
func newHandoverConn(conn net.Conn, ln *handoverListener, prefix []byte, read bool) net.Conn {
	c := &handoverConn{Conn: conn, ln: ln, prefix: prefix, boundary: true, read: read}
	c.idle = sync.NewCond(&c.mu)
	if tc, ok := conn.(*tls.Conn); ok {
		return &tlsHandoverConn{handoverConn: c, tls: tc}
	}
	return c
}

// tlsHandoverConn is the view of a TLS connection whose handshake is done
// (HTTP/1.1): its ConnectionState lets the server fill r.TLS (net/http
// does for a connection that is not a *tls.Conn but has one; Caddy reads
// it through its own wrapper).
type tlsHandoverConn struct {
	*handoverConn
	tls *tls.Conn
}

// ConnectionState is the TLS connection's state.
func (c *tlsHandoverConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

// got records the bytes p of a Read into a buffer of size (c.mu held).
func (c *handoverConn) got(p []byte, size int) {
	if len(p) > 0 && !c.read {
		c.read = true
		if n := min(len(p), len(h2Preface)); string(p[:n]) == h2Preface[:n] {
			// HTTP/2 with prior knowledge (h2c): its shutdown sends
			// GOAWAY; the connection never moves to an HTTP/1 server.
			c.tainted = true
		}
	}
	switch {
	case len(p) == 0:
	case c.boundary:
		if len(c.seq)+len(p) > maxReplay {
			c.seq, c.over = nil, true
		} else if !c.over {
			c.seq = append(c.seq, p...)
		}
	case size == 1 && len(c.peeked) < 8:
		c.peeked = append(c.peeked, p[0])
	default:
		c.bulkBefore = true
	}
}

func (c *handoverConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		c.got(p[:n], len(p))
		c.mu.Unlock()
		return n, nil
	}
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reading = false
	c.idle.Broadcast()
	if c.gone {
		// Handed over while this Read waited: what it got belongs to
		// the next server.
		c.carry = append(c.carry, p[:n]...)
		return 0, net.ErrClosed
	}
	c.got(p[:n], len(p))
	var ne net.Error
	timeout := errors.As(err, &ne) && ne.Timeout()
	if err != nil && (!timeout || c.boundary && len(c.seq) > 0) {
		// A timeout is net/http ending its background read after a
		// handler, or an idle timeout (followed by a close outside a
		// shutdown). Anything else ends the connection, a request head's
		// read timeout included.
		c.tainted = true
	}
	return n, err
}

func (c *handoverConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	c.boundary, c.seq, c.over = false, nil, false
	c.peeked, c.bulkBefore = c.peeked[:0], false
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	if err != nil {
		c.mu.Lock()
		c.tainted = true
		c.mu.Unlock()
	}
	return n, err
}

// CloseWrite half-closes the connection (net/http's closeWriteAndWait);
// such a connection is never handed over.
func (c *handoverConn) CloseWrite() error {
	c.mu.Lock()
	c.tainted = true
	c.mu.Unlock()
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *handoverConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return nil // the connection belongs to the next server now
	}
	return c.Conn.SetDeadline(t)
}

func (c *handoverConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *handoverConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return nil
	}
	if t.IsZero() {
		// net/http clears the write deadline once a response and its
		// request are done with: the boundary.
		c.boundary = true
	}
	return c.Conn.SetWriteDeadline(t)
}

// Close closes the connection, or, when the server is shutting down,
// hands it to the newest server on the same socket if nothing of it is
// lost that way (see handoverConn): a connection between two requests, or
// one whose next request the shutting-down server began to read (net/http
// drops a request read during its shutdown), which the next server is
// given from its first byte.
func (c *handoverConn) Close() error {
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return nil
	}
	c.gone = true
	var next *handoverListener
	intact := !c.tainted && !c.over && !c.bulkBefore && (c.boundary || len(c.peeked) == 0)
	if intact && c.boundary && !c.ln.closed() && (len(c.seq) > 0 || handovers.successor(c.ln) != nil) {
		// net/http's Shutdown marks the server as shutting down before
		// it closes its listener. In between, the server drops a request
		// it reads unanswered (only a shutdown does that), and closes a
		// connection at the end of a response that did not say
		// "Connection: close" (net/http: "such is life with HTTP/1.1"),
		// whose client then sends its next request into a closed socket.
		// Under machine load that window is wide. A newer server on the
		// same socket means a reload is under way and this listener
		// closes next: wait for that, then hand the connection over.
		c.ln.awaitClose(time.Second)
	}
	if c.ln.closed() && intact && !caddy.Exiting() {
		next = handovers.successor(c.ln)
	}
	if next == nil {
		c.mu.Unlock()
		return c.Conn.Close()
	}
	// Wake a Read waiting for the next request; what it gets is kept.
	if c.reading {
		_ = c.Conn.SetReadDeadline(time.Now())
		for c.reading {
			c.idle.Wait()
		}
	}
	prefix := make([]byte, 0, len(c.peeked)+len(c.seq)+len(c.prefix)+len(c.carry))
	prefix = append(append(append(append(prefix, c.peeked...), c.seq...), c.prefix...), c.carry...)
	c.peeked, c.seq, c.prefix, c.carry = nil, nil, nil, nil
	c.mu.Unlock()
	if err := c.Conn.SetDeadline(time.Time{}); err != nil {
		return c.Conn.Close()
	}
	if !next.inject(pending{c: c.Conn, prefix: prefix, read: true}) {
		return c.Conn.Close()
	}
	return nil
}
