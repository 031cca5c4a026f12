package module

import (
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves goroutines behind (Caddy
// instances, engine simulators, AfterFunc releases).
func TestMain(m *testing.M) {
	code := m.Run()
	// Keep-alive connections of the shared transport (SDK clients, test
	// helpers) outlive the test that opened them until closed here.
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(leakOptions...); err != nil {
			os.Stderr.WriteString("goleak: Errors on successful test run: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions are the goroutines that are not the tests' to stop.
var leakOptions = []goleak.Option{
	// certmagic keeps the storage lock file fresh for the process.
	goleak.IgnoreAnyFunction("github.com/caddyserver/certmagic.keepLockfileFresh"),
	// The sweeper of request states (request.go, edge.Sweeper) runs while
	// a state is open; the unit tests' httptest requests
	// (context.Background) never end, so their states stay open for the
	// process.
	goleak.IgnoreAnyFunction("github.com/ramjet-llm/ramjet/edge.(*Sweeper).run"),
	// zmq4 v0.17.0's PUB socket Close does not stop its writer
	// goroutine; the kv tests' engine simulators publish KV events.
	goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	// Caddy starts one cleaner of dynamic upstream hosts per process
	// (reverseproxy/hosts.go), on the first dynamic upstream
	// (dynamic_test.go).
	goleak.IgnoreAnyFunction("github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy.(*Upstream).fillDynamicHost.func1.1"),
	// An idle keep-alive connection between Caddy's reverse-proxy (or
	// health-check) transport and an engine simulator: a round trip that
	// ended while Caddy stopped returns its connection to a pool that its
	// Cleanup already emptied, and nothing outside Caddy can close it (it
	// times out on its own). Both ends are ignored; stopCaddy still fails a
	// test whose servers or shutdowns are left running.
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreAnyFunction("net/http.(*conn).maybeServeUnencryptedHTTP2"),
}
