package kvindex

import (
	"context"
	"sync"
)

// The handover of a bound event socket from one Subscriber to the next of
// the same service (a config reload starts the new subscriber before it
// stops the old one). Engines' PUB sockets connect to the address they
// were given and redial it after a lost connection (libzmq every 100 ms):
// the next subscriber must listen on the same port, even when the
// configured address has port 0, and only once the previous one let it
// go. Subscribers with the same SubscriberConfig.Handover key and bound
// address share a record of the address the last one listened on and of
// whether one still holds it.

// boundPort is one (handover key, configured address)'s record.
type boundPort struct {
	addr     string        // the address last listened on ("tcp://host:port"); "" before any
	held     bool          // a subscriber listens on it now
	released chan struct{} // closed when the holder lets it go
}

var boundPorts struct {
	mu sync.Mutex
	m  map[string]*boundPort
}

// handoverAddr returns the address a subscriber of key should listen on
// for the configured bound address addr: the one the previous subscriber
// of key listened on (once it let it go: waiting while it holds it, until
// ctx ends), else addr itself. Without a key it is addr.
func handoverAddr(ctx context.Context, key, addr string, waiting func(held string)) (string, error) {
	if key == "" {
		return addr, nil
	}
	k := key + "\x00" + addr
	warned := false
	for {
		boundPorts.mu.Lock()
		bp := boundPorts.m[k]
		if bp == nil || bp.addr == "" {
			boundPorts.mu.Unlock()
			return addr, nil
		}
		if !bp.held {
			a := bp.addr
			boundPorts.mu.Unlock()
			return a, nil
		}
		released := bp.released
		held := bp.addr
		boundPorts.mu.Unlock()
		if !warned && waiting != nil {
			warned = true
			waiting(held)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-released:
		}
	}
}

// holdBound records that a subscriber of key listens on actual for the
// configured address addr; the returned func lets it go (the socket is
// closed). Without a key it records nothing.
func holdBound(key, addr, actual string) (release func()) {
	if key == "" {
		return func() {}
	}
	k := key + "\x00" + addr
	boundPorts.mu.Lock()
	if boundPorts.m == nil {
		boundPorts.m = map[string]*boundPort{}
	}
	bp := &boundPort{addr: actual, held: true, released: make(chan struct{})}
	boundPorts.m[k] = bp
	boundPorts.mu.Unlock()
	return func() {
		boundPorts.mu.Lock()
		bp.held = false
		close(bp.released)
		boundPorts.mu.Unlock()
	}
}
