package handover

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ramjet-llm/ramjet/caddyblock"
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
// Only HTTP/1.1 connections that are between two requests (nothing read
// since the last response byte), or whose next request the old server
// began to read, are handed over, and only while a newer server on the
// same socket accepts. A connection the old server closes at the end of a
// response while a newer server is on the socket waits (up to a second)
// for the old listener to close first: net/http marks a server as
// shutting down before it closes its listener, and closes connections that
// finish a response in between. A connection with a partly read request
// body and every close outside a shutdown are closed as before.
//
// TLS: Caddy wraps listeners after its TLS listener, so this wrapper sees
// *tls.Conn. It completes each handshake itself (in a goroutine per
// connection, bounded by handshake_timeout) before the server accepts the
// connection. A connection that negotiated http/1.1 (or no ALPN) is handed
// over like a plain one: the *tls.Conn itself moves, in a view whose
// ConnectionState lets the server fill r.TLS. A connection that negotiated
// h2 is given to the server as the bare *tls.Conn (net/http serves h2 only
// on that): HTTP/2 needs no handover, a shutdown sends GOAWAY and clients
// retry the streams the server did not process on a new connection. A
// failed handshake is given to the server as is, which reports it as
// net/http does.
//
// Caddyfile, in the global options:
//
//	servers {
//	    listener_wrappers {
//	        ramjet_handover [{
//	            handshake_timeout <duration>
//	        }]
//	    }
//	}
type Handover struct {
	// HandshakeTimeout bounds a TLS handshake, which the wrapper completes
	// before the server accepts the connection. Default: 10s.
	HandshakeTimeout caddy.Duration `json:"handshake_timeout,omitempty"`
}

// defaultHandshakeTimeout is HandshakeTimeout's default.
const defaultHandshakeTimeout = 10 * time.Second

// CaddyModule returns the Caddy module information.
func (Handover) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "caddy.listeners.ramjet_handover",
		New: func() caddy.Module { return new(Handover) },
	}
}

// UnmarshalCaddyfile reads `ramjet_handover [{ handshake_timeout <d> }]`
// (caddyblock: unknown and repeated options are refused; 0 is accepted and
// means the default, as in JSON).
func (h *Handover) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	b := &caddyblock.Block{Name: "ramjet_handover", Zero: func(path string) bool { return path == "handshake_timeout" }}
	return b.Parse(d, h)
}

// Validate rejects a negative handshake_timeout.
func (h *Handover) Validate() error {
	if h.HandshakeTimeout < 0 {
		return fmt.Errorf("handshake_timeout must not be negative")
	}
	return nil
}

// WrapListener wraps ln and registers it as the successor of the
// listeners on the same socket.
func (h *Handover) WrapListener(ln net.Listener) net.Listener {
	timeout := time.Duration(h.HandshakeTimeout)
	if timeout == 0 {
		timeout = defaultHandshakeTimeout
	}
	l := &handoverListener{
		inner:    ln,
		key:      ln.Addr().Network() + "/" + ln.Addr().String(),
		timeout:  timeout,
		accepted: make(chan acceptResult),
		injected: make(chan pending),
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

// pending is a connection on its way to a server: accepted, handshaken,
// or handed over by an older server.
type pending struct {
	c      net.Conn // the socket, or the *tls.Conn over it
	prefix []byte   // bytes the server reads before the connection's
	bare   bool     // give c to the server as is (h2, failed handshake)
	read   bool     // an older server read from c (handed over)
}

// handoverListener is one server's listener. Its accept loop goroutine
// (started by the first Accept, stopped by Close) feeds Accept together
// with the connections handed over by older servers and the TLS
// connections whose handshake finished.
type handoverListener struct {
	inner    net.Listener
	key      string
	timeout  time.Duration // of a TLS handshake
	start    sync.Once
	accepted chan acceptResult
	injected chan pending
	done     chan struct{}
	close    sync.Once
}

func (l *handoverListener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.acceptLoop() })
	var p pending
	select {
	case p = <-l.injected:
	case r := <-l.accepted:
		if r.err != nil {
			return nil, r.err
		}
		p = pending{c: r.c}
	case <-l.done:
		return nil, net.ErrClosed
	}
	if l.closed() {
		// Close raced this select: the server is shutting down and may
		// already have found itself idle, so a connection given to it now
		// could be served under a cancelled config. The next server takes
		// it.
		l.passOn(p)
		return nil, net.ErrClosed
	}
	return l.view(p), nil
}

// view is what l's server is given of p.
func (l *handoverListener) view(p pending) net.Conn {
	if p.bare {
		return p.c
	}
	return newHandoverConn(p.c, l, p.prefix, p.read)
}

func (l *handoverListener) acceptLoop() {
	for {
		c, err := l.inner.Accept()
		if tc, ok := c.(*tls.Conn); ok && err == nil {
			go l.handshake(tc)
			continue
		}
		select {
		case l.accepted <- acceptResult{c, err}:
		case <-l.done:
			if c != nil {
				l.passOn(pending{c: c})
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

// handshake completes tc's TLS handshake within l's handshake timeout and
// gives the connection to l's server (or the next one if l closed
// meanwhile): one that negotiated HTTP/1.1 in a handover view, any other
// as the bare *tls.Conn. A failed handshake leaves its error in tc, which
// the server's own handshake call returns and reports.
func (l *handoverListener) handshake(tc *tls.Conn) {
	p := pending{c: tc, bare: true}
	_ = tc.SetDeadline(time.Now().Add(l.timeout))
	err := tc.Handshake()
	_ = tc.SetDeadline(time.Time{})
	if err == nil {
		switch tc.ConnectionState().NegotiatedProtocol {
		case "", "http/1.1":
			p.bare = false
		}
	}
	select {
	case l.injected <- p:
	case <-l.done:
		l.passOn(p)
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

// passOn gives a connection that reached l as l closed to the next server
// on the socket (closing it if there is none): its client already sent,
// or is about to send, its first request.
func (l *handoverListener) passOn(p pending) {
	next := handovers.successor(l)
	if next == nil || caddy.Exiting() || !next.inject(p) {
		p.c.Close()
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

// inject hands p to l's server; false if l closed meanwhile.
func (l *handoverListener) inject(p pending) bool {
	select {
	case l.injected <- p:
		return true
	case <-l.done:
		return false
	}
}

// Interface guards
var (
	_ caddy.ListenerWrapper = (*Handover)(nil)
	_ caddy.Validator       = (*Handover)(nil)
	_ caddyfile.Unmarshaler = (*Handover)(nil)
)
