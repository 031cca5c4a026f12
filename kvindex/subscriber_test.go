package kvindex

import (
	"context"
	"encoding/binary"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) {
	// zmq4 v0.17.0's PUB socket never stops its writer goroutine on Close
	// (pubSocket.Close does not close its pubMWriter). Only the tests'
	// publisher uses PUB; kvindex's own sockets are SUB and DEALER.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// testPub is a vLLM-style publisher on real ZMQ sockets: a PUB socket
// sending [topic, seq, payload] and, optionally, a ROUTER answering replay
// requests from its buffer of past messages.
type testPub struct {
	t      *testing.T
	pub    zmq4.Socket
	router zmq4.Socket
	events string
	replay string
	cancel context.CancelFunc
	ctx    context.Context
	wg     sync.WaitGroup

	// topic is the topic frame (default "kv"); replayTopic adds it to
	// replay replies, as some emulators do.
	topic       []byte
	replayTopic bool

	mu  sync.Mutex
	buf []pubMsg
	seq uint64
}

type pubMsg struct {
	seq     uint64
	payload []byte
}

func newTestPub(t *testing.T, events string, withReplay bool) *testPub {
	t.Helper()
	return newPub(t, events, "", "kv", withReplay, false)
}

// newPub is newTestPub with the other conventions: dial, when not empty,
// is the subscriber's bound address the PUB connects to.
func newPub(t *testing.T, events, dial, topic string, withReplay, replayTopic bool) *testPub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &testPub{t: t, cancel: cancel, topic: []byte(topic), replayTopic: replayTopic}
	p.ctx = ctx
	if events == "" {
		events = "tcp://127.0.0.1:0"
	}
	if dial == "later" {
		// connect makes the PUB.
	} else if p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(discard)); dial != "" {
		if err := p.pub.Dial(dial); err != nil {
			cancel()
			t.Fatal(err)
		}
		p.events = dial
	} else {
		if err := p.pub.Listen(events); err != nil {
			cancel()
			t.Fatal(err)
		}
		p.events = "tcp://" + p.pub.Addr().String()
	}
	if withReplay {
		p.router = zmq4.NewRouter(ctx, zmq4.WithLogger(discard), zmq4.WithTimeout(time.Second))
		if err := p.router.Listen("tcp://127.0.0.1:0"); err != nil {
			cancel()
			t.Fatal(err)
		}
		p.replay = "tcp://" + p.router.Addr().String()
		p.wg.Add(1)
		go p.serveReplay()
	}
	t.Cleanup(p.close)
	return p
}

func (p *testPub) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		buf := append([]pubMsg{}, p.buf...)
		p.mu.Unlock()
		// A client that has what it needs closes early: sends to it fail,
		// and the server goes on serving others, as vLLM's does.
		failed := false
		for _, m := range buf {
			if m.seq >= start {
				if p.router.Send(p.reply(id, seqFrame(int64(m.seq)), m.payload)) != nil {
					failed = true
					break
				}
			}
		}
		if !failed {
			_ = p.router.Send(p.reply(id, seqFrame(-1), []byte{}))
		}
	}
}

// connect makes the PUB of a publisher made with dial "later": it
// connects to addr (a subscriber's bound address).
func (p *testPub) connect(addr string) {
	p.pub = zmq4.NewPub(p.ctx, zmq4.WithLogger(discard))
	if err := p.pub.Dial(addr); err != nil {
		p.t.Fatal(err)
	}
	p.events = addr
}

// reply frames one replay reply, with the topic frame when replayTopic.
func (p *testPub) reply(id, seq, payload []byte) zmq4.Msg {
	if p.replayTopic {
		return zmq4.NewMsgFrom(id, []byte{}, p.topic, seq, payload)
	}
	return zmq4.NewMsgFrom(id, []byte{}, seq, payload)
}

// publish sends payload under the next sequence number; drop keeps it in
// the replay buffer only, as if the subscriber had missed it.
func (p *testPub) publish(payload []byte, drop bool) uint64 {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.buf = append(p.buf, pubMsg{seq, payload})
	p.mu.Unlock()
	if !drop {
		if err := p.pub.Send(zmq4.NewMsgFrom(p.topic, seqFrame(int64(seq)), payload)); err != nil {
			p.t.Errorf("publish: %v", err)
		}
	}
	return seq
}

// restartSeq makes the publisher start over at 0, as a restarted engine.
func (p *testPub) restartSeq() {
	p.mu.Lock()
	p.seq, p.buf = 0, nil
	p.mu.Unlock()
}

func (p *testPub) close() {
	p.cancel()
	if p.pub != nil {
		p.pub.Close()
	}
	if p.router != nil {
		p.router.Close()
	}
	p.wg.Wait()
}

// eventually polls cond every 5ms for up to 20s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// sync publishes empty batches until the subscriber receives one (ZMQ
// drops what a PUB sends before the subscription reaches it).
func (p *testPub) sync(t *testing.T, x *Index, r Replica) {
	t.Helper()
	before := x.Stats(r).Messages
	empty := encodeBatch(positional, 0, nil, 0)
	var last uint64
	published := false
	eventually(t, "a sync received", func() bool {
		if x.Stats(r).Messages != before {
			return true
		}
		last, published = p.publish(empty, false), true
		return false
	})
	if published {
		// The syncs still in flight arrive in order: wait for the last.
		eventually(t, "the last sync received", func() bool { return x.Stats(r).LastSeq >= last })
	}
}

func startSub(t *testing.T, x *Index, eps ...Endpoint) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(x, eps, SubscriberConfig{MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond, ReplayTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Start(context.Background())
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSubscriberAppliesEvents(t *testing.T) {
	p := newTestPub(t, "", false)
	x := New(Config{BlockSize: 4})
	startSub(t, x, Endpoint{Replica: "e1#0", Events: p.events, Topic: "kv"})
	r, _ := x.Lookup("e1#0")
	p.sync(t, x, r)

	prompt := seqTokens(10, 12)
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 4, prompt[:8], 1, 2)}, 0), false)
	p.publish(encodeBatch(mapped, 2, []wireEvent{stored(uint64(2), 4, prompt[8:], 3)}, 0), false)
	eventually(t, "three entries", func() bool { return x.Entries() == 3 })
	if got := overlaps(x, prompt); got[0] != 12 {
		t.Errorf("overlap %d, want 12", got[0])
	}
	st := x.Stats(r)
	if !st.Fresh || !st.Connected || st.Fences != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestSubscriberGapFences(t *testing.T) {
	p := newTestPub(t, "", false)
	x := New(Config{BlockSize: 2})
	startSub(t, x, Endpoint{Replica: "e", Events: p.events})
	r, _ := x.Lookup("e")
	p.sync(t, x, r)
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 2), 1)}, 0), false)
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(5, 2), 2)}, 0), true) // lost
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(9, 2), 3)}, 0), false)
	eventually(t, "a gap fence", func() bool { return x.Fences(FenceGap) == 1 })
	eventually(t, "the post-gap entry", func() bool { return x.Entries() == 1 })
	if got := overlaps(x, seqTokens(0, 2)); got[0] != 0 {
		t.Errorf("pre-gap block survived the fence")
	}
	if got := overlaps(x, seqTokens(9, 2)); got[0] != 2 {
		t.Errorf("post-gap block missing")
	}
	if x.Gaps() != 1 || !x.Fresh(r) || x.Stats(r).Complete {
		t.Errorf("gaps %d fresh %v complete %v", x.Gaps(), x.Fresh(r), x.Stats(r).Complete)
	}
}

func TestSubscriberReplayFillsGap(t *testing.T) {
	p := newTestPub(t, "", true)
	x := New(Config{BlockSize: 2})
	startSub(t, x, Endpoint{Replica: "e", Events: p.events, Replay: p.replay})
	r, _ := x.Lookup("e")
	p.sync(t, x, r)
	before := x.Replayed() // the sync messages the subscriber caught up on
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 2), 1)}, 0), false)
	p.publish(encodeBatch(mapped, 1, []wireEvent{stored(uint64(1), 2, seqTokens(2, 2), 2)}, 0), true)
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(uint64(2), 2, seqTokens(4, 2), 3)}, 0), true)
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(uint64(3), 2, seqTokens(6, 2), 4)}, 0), false)
	eventually(t, "four entries", func() bool { return x.Entries() == 4 })
	if got := overlaps(x, seqTokens(0, 8)); got[0] != 8 {
		t.Errorf("overlap %d, want 8 (the replayed blocks chain)", got[0])
	}
	if x.Gaps() != 1 || x.Replayed()-before != 2 || x.Fences(FenceGap) != 0 {
		t.Errorf("gaps %d replayed %d gap fences %d", x.Gaps(), x.Replayed()-before, x.Fences(FenceGap))
	}
}

func TestSubscriberCatchesUpOnJoin(t *testing.T) {
	// The engine ran before the subscriber connected: it catches up from
	// the replay buffer, then follows the live stream.
	p := newTestPub(t, "", true)
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 4), 1, 2)}, 0), false)
	p.publish(encodeBatch(mapped, 1, []wireEvent{removed(2), stored(uint64(1), 2, seqTokens(7, 2), 3)}, 0), false)
	x := New(Config{BlockSize: 2})
	startSub(t, x, Endpoint{Replica: "e", Events: p.events, Replay: p.replay})
	r, _ := x.Lookup("e")
	p.sync(t, x, r)
	eventually(t, "caught up", func() bool { return x.Entries() == 2 })
	if got := overlaps(x, append(seqTokens(0, 2), seqTokens(7, 2)...)); got[0] != 4 {
		t.Errorf("overlap %d after catch-up, want 4", got[0])
	}
	if got := overlaps(x, seqTokens(0, 4)); got[0] != 2 {
		t.Errorf("removed block counted: overlap %d, want 2", got[0])
	}
	if x.Fences(FenceGap) != 0 || x.Gaps() != 0 {
		t.Errorf("gap fences %d gaps %d", x.Fences(FenceGap), x.Gaps())
	}
	if !x.Stats(r).Complete {
		t.Error("not complete after catching up from sequence 0")
	}
}

func TestSubscriberResetAndDecodeError(t *testing.T) {
	p := newTestPub(t, "", false)
	x := New(Config{BlockSize: 2})
	startSub(t, x, Endpoint{Replica: "e", Events: p.events})
	r, _ := x.Lookup("e")
	p.sync(t, x, r)
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 2), 1)}, 0), false)
	p.publish([]byte{0x93, 0xc1}, false) // garbage
	eventually(t, "a decode fence", func() bool { return x.Fences(FenceDecode) == 1 })
	if x.DecodeErrors() != 1 || x.Entries() != 0 || x.Fresh(r) {
		t.Errorf("decode errors %d entries %d fresh %v", x.DecodeErrors(), x.Entries(), x.Fresh(r))
	}
	// The next message is in sequence: no gap.
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 2), 1)}, 0), false)
	eventually(t, "fresh again", func() bool { return x.Fresh(r) })
	// The engine restarts: sequence numbers start over.
	p.restartSeq()
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(4, 2), 9)}, 0), false)
	eventually(t, "a reset fence", func() bool { return x.Fences(FenceReset) == 1 })
	if x.Gaps() != 0 {
		t.Errorf("gaps %d", x.Gaps())
	}
}

func TestSubscriberReconnects(t *testing.T) {
	p := newTestPub(t, "", false)
	x := New(Config{BlockSize: 2})
	startSub(t, x, Endpoint{Replica: "e", Events: p.events})
	r, _ := x.Lookup("e")
	p.sync(t, x, r)
	p.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 2), 1)}, 0), false)
	eventually(t, "an entry", func() bool { return x.Entries() == 1 })

	// The engine dies: the replica is fenced.
	addr := p.events
	p.close()
	eventually(t, "a reconnect fence", func() bool { return x.Fences(FenceReconnect) == 1 })
	if x.Fresh(r) || x.Entries() != 0 {
		t.Errorf("fresh %v entries %d after the feed was lost", x.Fresh(r), x.Entries())
	}
	// It comes back on the same address: events flow again.
	p2 := newTestPub(t, addr, false)
	p2.sync(t, x, r)
	p2.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 2), 1)}, 0), false)
	eventually(t, "fresh after reconnect", func() bool { return x.Fresh(r) && x.Entries() == 1 })
}

func TestSubscriberUnreachable(t *testing.T) {
	// Nothing listens: the subscriber retries with backoff and Close stops it.
	x := New(Config{})
	core, logs := observer.New(zap.DebugLevel)
	s, err := NewSubscriber(x, []Endpoint{{Replica: "e", Events: "tcp://127.0.0.1:1"}}, SubscriberConfig{
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	s.Start(context.Background())
	t.Cleanup(func() { s.Close() })
	eventually(t, "three failed connection attempts", func() bool {
		return logs.FilterMessage("kv event feed unreachable").Len() >= 3
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r, _ := x.Lookup("e")
	if x.Fresh(r) || x.Fences(FenceReconnect) != 0 {
		t.Errorf("fresh %v fences %d", x.Fresh(r), x.Fences(FenceReconnect))
	}
}

func TestRankEndpoint(t *testing.T) {
	ep, err := RankEndpoint("127.0.0.1:8000", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", "kv", 2)
	if err != nil {
		t.Fatal(err)
	}
	want := Endpoint{Replica: "127.0.0.1:8000#2", Events: "tcp://127.0.0.1:5559", Replay: "tcp://127.0.0.1:5560", Topic: "kv"}
	if !reflect.DeepEqual(ep, want) {
		t.Errorf("got %+v, want %+v", ep, want)
	}
	for _, bad := range []string{"ipc:///tmp/x", "tcp://host", "tcp://host:0x"} {
		if _, err := RankEndpoint("a", bad, "", "", 1); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Several engines whose PUB sockets connect to one bound SUB, told apart by
// topic (llm-d's convention); one replays with a topic frame. A dropped
// message is replayed, and a message of an unknown topic is dropped.
func TestSubscriberBindsForConnectingEngines(t *testing.T) {
	x := New(Config{BlockSize: 4})
	bind := "tcp://127.0.0.1:0"
	const ta, tb = "kv@127.0.0.1:8001@m", "kv@127.0.0.1:8002@m"
	// The replay sockets are the engines' ROUTERs, bound as always: make
	// them first (a PUB that dials needs the bound address, known later).
	ra := newPub(t, "", "later", ta, true, true)
	rb := newPub(t, "", "later", tb, true, false)
	s := startSub(t, x,
		Endpoint{Replica: "a", Events: bind, Topic: ta, Bind: true, Replay: ra.replay},
		Endpoint{Replica: "b", Events: bind, Topic: tb, Bind: true, Replay: rb.replay})
	var addr string
	eventually(t, "the subscriber listening", func() bool { addr = s.BoundAddr(bind); return addr != "" })
	ra.connect(addr)
	rb.connect(addr)
	a, _ := x.Lookup("a")
	b, _ := x.Lookup("b")
	ra.sync(t, x, a)
	rb.sync(t, x, b)
	prompt := seqTokens(40, 8)
	ra.publish(encodeBatch(positional, 1, []wireEvent{stored(nil, 4, prompt[:4], 1)}, 0), true) // missed
	ra.publish(encodeBatch(positional, 2, []wireEvent{stored(uint64(1), 4, prompt[4:], 2)}, 0), false)
	rb.publish(encodeBatch(mapped, 1, []wireEvent{stored(nil, 4, prompt[:4], 7)}, 0), false)
	eventually(t, "both feeds applied", func() bool {
		o := overlaps(x, prompt)
		return o[a] == 8 && o[b] == 4
	})
	if st := x.Stats(a); st.Replayed == 0 || !st.Connected || !st.Healthy {
		t.Errorf("a: %+v, want a replayed message, connected, healthy", st)
	}
	if x.ReplayFailures() != 0 {
		t.Errorf("%d replay failures", x.ReplayFailures())
	}
	// A feed that delivers only orphans is flagged and falls back.
	for i := range 40 {
		rb.publish(encodeBatch(positional, 3, []wireEvent{stored(uint64(999), 4, prompt[4:], uint64(100+i))}, 0), false)
	}
	eventually(t, "the orphan feed flagged", func() bool { st := x.Stats(b); return !st.Healthy && !st.Fresh })
	if st := x.Stats(a); !st.Healthy || !st.Fresh {
		t.Errorf("the other feed on the same socket: %+v", st)
	}
	// Same topic twice on one bound address is refused.
	if _, err := NewSubscriber(New(Config{}), []Endpoint{{Replica: "a", Events: bind, Bind: true, Topic: "t"},
		{Replica: "b", Events: bind, Bind: true, Topic: "t"}}, SubscriberConfig{}); err == nil {
		t.Error("two endpoints with one topic on one bound address accepted")
	}
}
