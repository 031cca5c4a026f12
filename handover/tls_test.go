package handover

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// testCert is a self-signed certificate for 127.0.0.1 and a pool that
// trusts it.
func testCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// tlsServers is one socket with a TLS listener, as Caddy builds it (the
// socket, tls.NewListener, then the listener wrappers), on which a test
// starts servers one after the other as a reload does.
type tlsServers struct {
	t     *testing.T
	inner net.Listener
	cfg   *tls.Config
	h     Handover
}

func newTLSServers(t *testing.T, cert tls.Certificate) *tlsServers {
	t.Helper()
	return &tlsServers{t: t, inner: socket(t), cfg: &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
	}}
}

// start serves name on the socket: a handler answering with the server's
// name, the protocol and whether r.TLS is set.
func (s *tlsServers) start(name string) *http.Server {
	s.t.Helper()
	ln := s.h.WrapListener(tls.NewListener(keepOpenListener{s.inner}, s.cfg))
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("X-Server", name)
			if r.TLS != nil && r.TLS.HandshakeComplete {
				w.Header().Set("X-TLS", "tls "+r.TLS.NegotiatedProtocol)
			}
			io.WriteString(w, r.Proto)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.Serve(ln)
	s.t.Cleanup(func() { srv.Close() })
	return srv
}

func (s *tlsServers) url() string { return "https://" + s.inner.Addr().String() + "/" }

// answer is one response as a client saw it.
type answer struct {
	server, tls, proto string
	reused             bool
}

func get(t *testing.T, c *http.Client, url string) answer {
	t.Helper()
	var a answer
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(ci httptrace.GotConnInfo) { a.reused = ci.Reused },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a.server, a.tls, a.proto = resp.Header.Get("X-Server"), resp.Header.Get("X-TLS"), string(b)
	return a
}

// TestHandoverTLSHTTP1: a TLS keep-alive connection that negotiated
// http/1.1 moves to the new server when the old one shuts down; the
// client's next POST on the same connection is answered there, and both
// servers see r.TLS. Before TLS support the wrapper left *tls.Conn alone
// and the old server's shutdown closed the connection under the client.
func TestHandoverTLSHTTP1(t *testing.T) {
	cert, pool := testCert(t)
	s := newTLSServers(t, cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	old := s.start("old")
	if a := get(t, c, s.url()); a != (answer{server: "old", tls: "tls http/1.1", proto: "HTTP/1.1"}) {
		t.Fatalf("first answer %+v", a)
	}
	s.start("new")
	if err := old.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := get(t, c, s.url()); a != (answer{server: "new", tls: "tls http/1.1", proto: "HTTP/1.1", reused: true}) {
		t.Fatalf("after the old server's shutdown: %+v; want the new server on the same connection", a)
	}
}

// TestHandoverTLSH2: a connection that negotiated h2 reaches the server as
// the bare *tls.Conn (net/http serves h2 only on that). At the old
// server's shutdown it sends GOAWAY and Go's client takes its next request
// to a new connection, answered by the new server: no request fails.
func TestHandoverTLSH2(t *testing.T) {
	cert, pool := testCert(t)
	s := newTLSServers(t, cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	old := s.start("old")
	if a := get(t, c, s.url()); a != (answer{server: "old", tls: "tls h2", proto: "HTTP/2.0"}) {
		t.Fatalf("first answer %+v", a)
	}
	s.start("new")
	if err := old.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := get(t, c, s.url()); a != (answer{server: "new", tls: "tls h2", proto: "HTTP/2.0"}) {
		t.Fatalf("after the old server's shutdown: %+v; want the new server on a new connection", a)
	}
}

// TestHandoverTLSHandshakeBounded: a client that opens a connection and
// never completes its handshake neither holds up the next client's
// (handshakes run beside Accept) nor stays open past handshake_timeout.
func TestHandoverTLSHandshakeBounded(t *testing.T) {
	cert, pool := testCert(t)
	s := newTLSServers(t, cert)
	s.h.HandshakeTimeout = caddy.Duration(300 * time.Millisecond)
	s.start("only")
	stalled, err := net.Dial("tcp", s.inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}}}
	defer tr.CloseIdleConnections()
	if a := get(t, &http.Client{Transport: tr}, s.url()); a.server != "only" {
		t.Fatalf("answer %+v behind a stalled handshake", a)
	}
	_ = stalled.SetReadDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	_, err = io.ReadAll(stalled)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the stalled connection still open after %v (handshake_timeout 300ms)", time.Since(start))
	}
}

// TestHandoverTLSFailedHandshake: a plain HTTP request on the TLS port
// gets net/http's own answer (400, "Client sent an HTTP request to an
// HTTPS server"): the server's handshake reports the wrapper's failed one.
func TestHandoverTLSFailedHandshake(t *testing.T) {
	cert, _ := testCert(t)
	s := newTLSServers(t, cert)
	s.start("only")
	resp, err := http.Get("http://" + s.inner.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "HTTPS server") {
		t.Fatalf("plain HTTP on the TLS port: %s %q", resp.Status, b)
	}
}
