package enginesim

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

// poll evaluates cond every 5ms until it holds or d passes, and reports
// whether it held (the caller asserts what it needs afterwards).
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

func TestMain(m *testing.M) {
	// zmq4 v0.17.0's PUB socket Close does not stop its writer goroutine
	// (pubSocket.Close never closes its pubMWriter); one parked goroutine
	// per PUB socket ever created, not ours to stop.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
