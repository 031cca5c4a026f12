package handover

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func init() { caddy.RegisterModule(Handover{}) }

// Handover is a listener wrapper that carries idle HTTP/1.1 keep-alive
// connections across a config reload instead of closing them.
//
// At a reload, Caddy starts the new config's servers on the same sockets
// and shuts the old ones down. Go's http.Server shutdown closes every idle
// keep-alive connection at once, and drops any request it reads after the
// shutdown began; a client that sent a request on such a connection at
// that instant sees a reset or EOF after its request went out, which no
// HTTP client retries for a POST. With this wrapper, an idle connection
// that the old server closes is handed, still open, to the new server on
// the same socket, which reads the next request from it: the client never
// sees the reload.
//
// Only plain-text HTTP/1.1 connections that are between two requests
// (nothing read since the last response byte) are handed over, and only
// while a newer server on the same socket accepts. A connection the old
// server closes at the end of a response while a newer server is on the
// socket waits (up to a second) for the old listener to close first: net/http
// marks a server as shutting down before it closes its listener, and closes
// connections that finish a response in between; TLS connections, a
// connection with a partly read request, and every close outside a
// shutdown are closed as before. HTTP/2 connections need none of this
// (their shutdown sends GOAWAY).
//
// Caddyfile, in the global options:
//
//	servers {
//	    listener_wrappers {
//	        ramjet_handover
//	    }
//	}
type Handover struct{}

// CaddyModule returns the Caddy module information.
func (Handover) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.listeners.ramjet_handover",
		New: func() caddy.Module { return new(Handover) },
	}
}

// UnmarshalCaddyfile reads `ramjet_handover` (no options).
func (*Handover) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(0) {
		return d.Err("ramjet_handover takes no options")
	}
	return nil
}

// WrapListener wraps ln and registers it as the successor of the
// listeners on the same socket.
func (*Handover) WrapListener(ln net.Listener) net.Listener {
	l := &handoverListener{
		inner:    ln,
		key:      ln.Addr().Network() + "/" + ln.Addr().String(),
		accepted: make(chan acceptResult),
		injected: make(chan net.Conn),
		done:     make(chan struct{}),
	}
	handovers.add(l)
	return l
}

// handovers are the open handover listeners by socket, oldest first.
var handovers = &handoverRegistry{byKey: map[string][]*handoverListener{}}

type handoverRegistry struct {
	mu    sync.Mutex
	byKey map[string][]*handoverListener
}

func (r *handoverRegistry) add(l *handoverListener) {
	r.mu.Lock()
	r.byKey[l.key] = append(r.byKey[l.key], l)
	r.mu.Unlock()
}

func (r *handoverRegistry) remove(l *handoverListener) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ls := r.byKey[l.key]
	for i, x := range ls {
		if x == l {
			ls = append(ls[:i:i], ls[i+1:]...)
			break
		}
	}
	if len(ls) == 0 {
		delete(r.byKey, l.key)
	} else {
		r.byKey[l.key] = ls
	}
}

// successor is the newest open listener on l's socket other than l, nil
// if there is none.
func (r *handoverRegistry) successor(l *handoverListener) *handoverListener {
	r.mu.Lock()
	defer r.mu.Unlock()
	ls := r.byKey[l.key]
	for i := len(ls) - 1; i >= 0; i-- {
		if ls[i] != l {
			return ls[i]
		}
	}
	return nil
}

type acceptResult struct {
	c   net.Conn
	err error
}

// handoverListener is one server's listener. Its accept loop goroutine
// (started by the first Accept, stopped by Close) feeds Accept together
// with the connections handed over by older servers.
type handoverListener struct {
	inner    net.Listener
	key      string
	start    sync.Once
	accepted chan acceptResult
	injected chan net.Conn
	done     chan struct{}
	close    sync.Once
}

func (l *handoverListener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.acceptLoop() })
	select {
	case c := <-l.injected:
		return c, nil
	case r := <-l.accepted:
		if r.err != nil {
			return nil, r.err
		}
		if l.closed() {
			// Close raced this select: the server is shutting down and
			// may already have found itself idle, so a connection given
			// to it now could be served under a cancelled config. The
			// next server takes it.
			l.passOn(r.c)
			return nil, net.ErrClosed
		}
		if _, ok := r.c.(*tls.Conn); ok {
			return r.c, nil // TLS state cannot move to another server
		}
		return newHandoverConn(r.c, l, nil), nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoverListener) acceptLoop() {
	for {
		c, err := l.inner.Accept()
		select {
		case l.accepted <- acceptResult{c, err}:
		case <-l.done:
			if c != nil {
				l.passOn(c)
			}
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue // http.Server retries these
			}
			return
		}
	}
}

// Close stops accepting: the server is shutting down.
func (l *handoverListener) Close() error {
	var err error
	l.close.Do(func() {
		handovers.remove(l)
		close(l.done)
		err = l.inner.Close()
	})
	return err
}

func (l *handoverListener) Addr() net.Addr { return l.inner.Addr() }

func (l *handoverListener) closed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// passOn gives a connection accepted as l closed to the next server on
// the socket (closing it if there is none): its client already sent, or
// is about to send, its first request.
func (l *handoverListener) passOn(c net.Conn) {
	next := handovers.successor(l)
	if next == nil || caddy.Exiting() {
		c.Close()
		return
	}
	if _, ok := c.(*tls.Conn); !ok {
		c = newHandoverConn(c, next, nil)
	}
	if !next.inject(c) {
		c.Close()
	}
}

// awaitClose waits up to d for l to close.
func (l *handoverListener) awaitClose(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.done:
	case <-t.C:
	}
}

// inject hands c to l's server; false if l closed meanwhile.
func (l *handoverListener) inject(c net.Conn) bool {
	select {
	case l.injected <- c:
		return true
	case <-l.done:
		return false
	}
}

// maxReplay bounds the bytes of a request kept for a replay on the next
// server: net/http reads a request's head (at most the server's header
// limit plus one buffer) before it drops a request that arrived during
// its shutdown.
const maxReplay = 1<<20 + 64<<10

// handoverConn is a server's view of one plain-text connection. It tracks
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
	tainted    bool       // a Read or Write failed, or the write side closed
	boundary   bool       // past the end of the last response's handling
	peeked     []byte     // one-byte reads between the last Write and the boundary
	bulkBefore bool       // other reads there (a drained request body)
	seq        []byte     // bytes read since the boundary
	over       bool       // seq outgrew maxReplay
	prefix     []byte     // bytes for this view to serve before the socket's
	carry      []byte     // bytes read after the handover began
}

func newHandoverConn(conn net.Conn, ln *handoverListener, prefix []byte) *handoverConn {
	c := &handoverConn{Conn: conn, ln: ln, prefix: prefix, boundary: true}
	c.idle = sync.NewCond(&c.mu)
	return c
}

// got records the bytes p of a Read into a buffer of size (c.mu held).
func (c *handoverConn) got(p []byte, size int) {
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
	if !next.inject(newHandoverConn(c.Conn, next, prefix)) {
		return c.Conn.Close()
	}
	return nil
}

// Interface guards
var (
	_ caddy.ListenerWrapper = (*Handover)(nil)
	_ caddyfile.Unmarshaler = (*Handover)(nil)
)
