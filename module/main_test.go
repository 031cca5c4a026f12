package module

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves goroutines behind (Caddy
// instances, engine simulators, AfterFunc releases).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// certmagic keeps the storage lock file fresh for the process.
		goleak.IgnoreAnyFunction("github.com/caddyserver/certmagic.keepLockfileFresh"),
		// zmq4 v0.17.0's PUB socket Close does not stop its writer
		// goroutine; the kv tests' engine simulators publish KV events.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		// Caddy starts one cleaner of dynamic upstream hosts per process
		// (reverseproxy/hosts.go), on the first dynamic upstream
		// (dynamic_test.go).
		goleak.IgnoreAnyFunction("github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy.(*Upstream).fillDynamicHost.func1.1"),
	)
}
