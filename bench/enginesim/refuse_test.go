package enginesim

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRefusingClosesUnusedConnections: a connection the simulator accepted
// but that never carried a request (a client's transport can keep such a
// dial in its idle pool) is closed when the simulator starts refusing, as
// idle ones are; a request sent on it afterwards is not answered.
// (module's TestServingRetriesLoseNothing saw a refusing engine answer the
// retried request: 200, and no other engine reached.)
func TestRefusingClosesUnusedConnections(t *testing.T) {
	s := startSim(t, Options{})
	addr := strings.TrimPrefix(s.URL(), "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Wait until the server tracks the connection as new.
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.connMu.Lock()
		n := 0
		for _, st := range s.conns {
			if st == http.StateNew {
				n++
			}
		}
		s.connMu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the simulator never saw the connection")
		}
		time.Sleep(time.Millisecond)
	}
	f := s.Faults()
	f.RefuseConnections = true
	if err := s.SetFaults(f); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		return // the close reached the client first: not answered
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a refusing simulator answered %d on a connection accepted before the refusal", resp.StatusCode)
	}
}
