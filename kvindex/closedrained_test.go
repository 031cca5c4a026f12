package kvindex

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// qreaderWaiting counts zmq4's SUB reader goroutines (qreader.listen),
// and those of them waiting to hand a message to a full queue.
func qreaderWaiting() (all, waiting int) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if !strings.Contains(g, "zmq4.(*qreader).listen") {
			continue
		}
		all++
		if strings.Contains(g, "[chan send") {
			waiting++
		}
	}
	return all, waiting
}

// TestCloseSubLeavesNoReader closes a bound SUB socket whose queue is full
// (a publisher keeps sending, nothing reads) and checks that no zmq4
// reader goroutine stays behind: with a plain Close the one waiting on
// the full queue waits for good (zmq4 v0.17.0).
func TestCloseSubLeavesNoReader(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx, zmq4.WithLogger(discard))
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	pub := zmq4.NewPub(pctx, zmq4.WithLogger(discard))
	defer pub.Close()
	if err := pub.Dial("tcp://" + sub.Addr().String()); err != nil {
		t.Fatal(err)
	}
	// Publish until the reader waits on the full queue (a PUB drops
	// messages until the subscription reached it, so keep sending).
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), []byte("payload"))); err != nil {
			t.Fatal(err)
		}
		if _, w := qreaderWaiting(); w > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the SUB reader never waited on a full queue")
		}
		runtime.Gosched()
	}
	CloseDrained(sub)
	for {
		all, _ := qreaderWaiting()
		if all == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d zmq4 SUB reader goroutines left after CloseDrained", all)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
