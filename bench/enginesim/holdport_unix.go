//go:build unix

package enginesim

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"
)

// holdPort binds a TCP socket to addr without listening on it, so that
// connections to addr are refused (the kernel answers a SYN to a port
// nobody listens on with a reset) while no other socket can be given the
// port: closing the listener alone would free it, and on a busy machine
// another process's listener on port 0 can be handed the same port and
// answer in the simulator's place. The listener's socket may outlive its
// Close for a moment (an Accept still returning), so binding retries
// briefly while the port is still listened on.
func holdPort(addr string) (func() error, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("hold %s: %w", addr, err)
	}
	family, sa := syscall.AF_INET, syscall.Sockaddr(nil)
	if ap.Addr().Is4() {
		sa = &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family = syscall.AF_INET6
		sa = &syscall.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM, 0)
	if err != nil {
		return nil, fmt.Errorf("hold %s: %w", addr, err)
	}
	syscall.CloseOnExec(fd) // not into the processes tests start
	// SO_REUSEADDR as Go's listeners set it: the port's closed
	// connections may still be in TIME_WAIT.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("hold %s: %w", addr, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err = syscall.Bind(fd, sa)
		if err == nil {
			return func() error { return syscall.Close(fd) }, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			syscall.Close(fd)
			return nil, fmt.Errorf("hold %s: %w", addr, err)
		}
		time.Sleep(wait) // the closed listener's socket is still being released
	}
}
