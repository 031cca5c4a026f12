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
	)
}
