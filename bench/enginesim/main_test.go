package enginesim

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// zmq4 v0.17.0's PUB socket Close does not stop its writer goroutine
	// (pubSocket.Close never closes its pubMWriter); one parked goroutine
	// per PUB socket ever created, not ours to stop.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
