package kvindex

import (
	"context"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// TestJoinReplayNotFresh: a feed that joins a running engine rebuilds its
// entries from the engine's replay buffer; until that replay ends the feed
// is neither fresh nor complete (a precise decision would read a partly
// rebuilt index as the engine's cache), and once it ends it is both, with
// every replayed block indexed.
func TestJoinReplayNotFresh(t *testing.T) {
	sim, err := enginesim.Start(context.Background(), enginesim.Options{Instant: true,
		Engine:   engine.Config{BlockSize: 16, CapacityTokens: 1 << 20},
		KVEvents: enginesim.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	// Stored before anyone listens: only the replay brings them in.
	const before = 1500
	for i := range before {
		complete(t, sim, engine.SyntheticTokens(nil, uint64(i), 64))
	}
	x := New(Config{BlockSize: 16})
	startSub(t, x, Endpoint{Replica: "e", Events: sim.KVEndpoints()[0], Replay: sim.KVReplayEndpoints()[0]})
	r, _ := x.Lookup("e")
	eventually(t, "connected", func() bool { return x.Stats(r).Connected })
	// Live messages make the subscriber join (and replay) while this
	// goroutine reads the stats as often as it can.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			complete(t, sim, engine.SyntheticTokens(nil, uint64(10000+i), 64))
		}
	}()
	midReplay := 0
	for {
		st := x.Stats(r)
		if st.Replayed > 0 {
			break
		}
		if st.Fresh || st.Complete {
			t.Fatalf("fresh %v, complete %v with %d entries before the join replay ended", st.Fresh, st.Complete, st.Entries)
		}
		if st.Entries > 0 {
			midReplay++
		}
		select {
		case <-done:
			eventually(t, "the join replay", func() bool { return x.Stats(r).Replayed > 0 })
		default:
		}
	}
	<-done
	// Every prompt, replayed or live, indexed: the feed is drained (a SUB
	// closed with messages queued leaves zmq4's reader goroutine behind).
	eventually(t, "fresh, complete and drained after the replay", func() bool {
		st := x.Stats(r)
		return st.Fresh && st.Complete && st.Entries >= (before+200)*4
	})
	// Each 64-token prompt is 4 blocks of 16: the replay brought every
	// earlier one in.
	if st := x.Stats(r); st.ReplayFailures != 0 || st.Orphans != 0 {
		t.Errorf("after the replay: %d replay failures, %d orphans", st.ReplayFailures, st.Orphans)
	}
	t.Logf("polls that saw a partly rebuilt index (not fresh): %d", midReplay)
}
