//go:build unix

package enginesim

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
)

// TestRefusingHoldsThePort: while connections are refused the port stays
// bound, so no other socket can take it (one without SO_REUSEADDR, as a
// port-0 listener's search treats it, fails to bind it), and clearing the
// fault listens on it again.
func TestRefusingHoldsThePort(t *testing.T) {
	s := startSim(t, Options{})
	addr := strings.TrimPrefix(s.URL(), "http://")
	f := s.Faults()
	f.RefuseConnections = true
	if err := s.SetFaults(f); err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(addr)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	err = syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("binding the refusing simulator's port: %v, want EADDRINUSE", err)
	}
	f.RefuseConnections = false
	if err := s.SetFaults(f); err != nil {
		t.Fatal(err)
	}
	if st := getJSON(t, s.URL()+"/health", nil); st != 200 {
		t.Errorf("health after clearing: %d", st)
	}
}
