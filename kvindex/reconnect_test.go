package kvindex

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/selection"
)

// cutProxy forwards TCP connections from its own listener (127.0.0.1:0) to
// target. cut closes every forwarded connection and refuses new ones until
// restore: a network path that breaks and comes back, on the same address.
// While down, or without a target, it accepts and closes at once (a
// failed handshake for a ZMQ peer).
type cutProxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	target string
	conns  []net.Conn
	down   bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) addr() string { return "tcp://" + p.ln.Addr().String() }

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down, target := p.down, p.target
		p.mu.Unlock()
		if down || target == "" {
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		for _, pair := range [][2]net.Conn{{c, u}, {u, c}} {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				_, _ = io.Copy(pair[0], pair[1])
				pair[0].Close()
				pair[1].Close()
			}()
		}
	}
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// retarget forwards new connections to target (host:port).
func (p *cutProxy) retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

func (p *cutProxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// warmUp sends completions to sim until one of them lands in x for r (ZMQ
// drops what is published before the subscription arrives).
func warmUp(t *testing.T, x *Index, r Replica, sim *enginesim.Server, seed uint64) {
	t.Helper()
	for i := 0; ; i++ {
		p := engine.SyntheticTokens(nil, seed+uint64(i), 40)
		complete(t, sim, p)
		for range 50 {
			if overlapOf(x, r, p) == 32 {
				return
			}
			eventuallyTick()
		}
		if i == 100 {
			t.Fatalf("no store landed: %+v", x.Stats(r))
		}
	}
}

// TestInteropReconnectReplays: the engine simulator in both replay
// framings (vLLM's [identity, "", seq, payload], and with a topic frame),
// its event connection cut and restored on the same address. The lost
// feed is fenced; the blocks the engine stored while it was down reach the
// index through the replay after the reconnect, and the index agrees with
// the engine's cached_tokens again.
func TestInteropReconnectReplays(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		seqFromOne, replayTopic bool
		enc                     enginesim.KVEncoding
	}{
		{name: "vllm-array", enc: enginesim.KVEncodingArray},
		{name: "map-seq1-replaytopic", seqFromOne: true, replayTopic: true, enc: enginesim.KVEncodingMap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const topic = "kv@127.0.0.1:8000@qwen3-32b"
			x := New(Config{BlockSize: 16})
			sim, err := enginesim.Start(context.Background(), enginesim.Options{Instant: true,
				Engine: engine.Config{BlockSize: 16, CapacityTokens: 1024 * 16},
				KVEvents: enginesim.KVEventsOptions{Topic: topic, Encoding: tc.enc, SeqFromOne: tc.seqFromOne,
					ReplayTopic: tc.replayTopic, Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sim.Close() })
			px := newCutProxy(t, strings.TrimPrefix(sim.KVEndpoints()[0], "tcp://"))
			startSub(t, x, Endpoint{Replica: "e", Events: px.addr(), Replay: sim.KVReplayEndpoints()[0], Topic: topic})
			r, _ := x.Lookup("e")
			warmUp(t, x, r, sim, 1000)

			px.cut()
			eventually(t, "the lost feed fenced", func() bool { return x.Fences(FenceReconnect) >= 1 && !x.Fresh(r) })
			// Stored by the engine while the feed is down.
			var missed [][]uint32
			for i := range 4 {
				p := engine.SyntheticTokens(nil, uint64(5000+i), 48)
				complete(t, sim, p)
				missed = append(missed, p)
			}
			replaysBefore := x.Stats(r).Replayed
			px.restore()
			// The subscriber redials; the first message it receives is past
			// the sequence it knows, so it asks the replay socket for the
			// engine's buffer. New requests make the engine publish.
			eventually(t, "the missed stores replayed", func() bool {
				complete(t, sim, engine.SyntheticTokens(nil, uint64(time.Now().UnixNano()), 20))
				for _, p := range missed {
					if overlapOf(x, r, p) != 48 {
						return false
					}
				}
				return x.Fresh(r)
			})
			if st := x.Stats(r); st.Replayed <= replaysBefore || x.ReplayFailures() != 0 {
				t.Errorf("replayed %d (before the reconnect %d), replay failures %d", st.Replayed, replaysBefore, x.ReplayFailures())
			}
			// A later turn of a missed prompt: the index agrees with the
			// engine's cached_tokens.
			p := append(append([]uint32(nil), missed[0]...), engine.SyntheticTokens(nil, 77, 20)...)
			if want, got := overlapOf(x, r, p), complete(t, sim, p); got != want || got != 48 {
				t.Errorf("after the reconnect: engine cached %d, index %d, want 48", got, want)
			}
		})
	}
}

// TestInteropBindReconnectReplays: engines whose PUB sockets connect to
// the subscriber's bound socket (llm-d's setup: vLLM "endpoint":
// "tcp://<indexer>:5557"), two of them on one address told apart by topic,
// each with its replay socket. The subscriber goes away while the engines
// keep storing, in two ways: the path between them breaks and comes back
// (the subscriber stays up; the engines redial as libzmq's PUB does, the
// next message is past the sequence the feed knows, and the gap is filled
// from each engine's replay socket), and the subscriber restarts on a new
// address behind the same path (the new subscriber joins each engine and
// catches up from its replay buffer). After the engines reconnect the
// index holds what they stored meanwhile and agrees with their
// cached_tokens.
func TestInteropBindReconnectReplays(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "path-cut"
		if restart {
			name = "subscriber-restart"
		}
		t.Run(name, func(t *testing.T) {
			x := New(Config{BlockSize: 16})
			// The engines dial the proxy; it forwards to whichever
			// subscriber is up (none yet: their first dials fail, and they
			// keep dialling).
			px := newCutProxy(t, "")
			topics := []string{"kv@127.0.0.1:8000@m", "kv@127.0.0.1:8001@m"}
			var sims []*enginesim.Server
			var eps []Endpoint
			for i, topic := range topics {
				sim, err := enginesim.Start(context.Background(), enginesim.Options{Instant: true,
					Engine: engine.Config{BlockSize: 16, CapacityTokens: 1024 * 16},
					KVEvents: enginesim.KVEventsOptions{Topic: topic, Connect: true, Endpoint: px.addr(),
						ReplayEndpoint: "tcp://127.0.0.1:0", SeqFromOne: i == 1, ReplayTopic: i == 1}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sim.Close() })
				sims = append(sims, sim)
				eps = append(eps, Endpoint{Replica: topic, Events: "tcp://127.0.0.1:0", Bind: true, Topic: topic,
					Replay: sim.KVReplayEndpoints()[0]})
			}
			listen := func() *Subscriber {
				s := startSub(t, x, eps...)
				eventually(t, "the subscriber listening", func() bool { return s.BoundAddr(eps[0].Events) != "" })
				px.retarget(strings.TrimPrefix(s.BoundAddr(eps[0].Events), "tcp://"))
				return s
			}
			s := listen()
			reps := make([]Replica, len(eps))
			for i := range eps {
				reps[i], _ = x.Lookup(eps[i].Replica)
				warmUp(t, x, reps[i], sims[i], uint64(1000+100*i))
			}
			var before []ReplicaStats
			for _, r := range reps {
				before = append(before, x.Stats(r))
			}
			if restart {
				s.Close()
			} else {
				px.cut()
			}
			// Stored by the engines while the subscriber is away.
			missed := make([][][]uint32, len(sims))
			for i, sim := range sims {
				for j := range 4 {
					p := engine.SyntheticTokens(nil, uint64(5000+10*i+j), 48)
					complete(t, sim, p)
					missed[i] = append(missed[i], p)
				}
			}
			if restart {
				listen()
			} else {
				px.restore()
			}
			// New requests make the engines publish once they are back.
			eventually(t, "the missed stores replayed", func() bool {
				for i, sim := range sims {
					complete(t, sim, engine.SyntheticTokens(nil, uint64(time.Now().UnixNano()), 20))
					for _, p := range missed[i] {
						if overlapOf(x, reps[i], p) != 48 {
							return false
						}
					}
					if !x.Fresh(reps[i]) {
						return false
					}
				}
				return true
			})
			for i, r := range reps {
				st := x.Stats(r)
				if st.Replayed <= before[i].Replayed || st.ReplayFailures != 0 {
					t.Errorf("%s: replayed %d (before %d), replay failures %d", eps[i].Replica, st.Replayed,
						before[i].Replayed, st.ReplayFailures)
				}
				if !restart && st.Gaps <= before[i].Gaps {
					t.Errorf("%s: %d gaps (before %d): the reconnect went unnoticed", eps[i].Replica, st.Gaps, before[i].Gaps)
				}
				if sims[i].KVRedials() == 0 {
					t.Errorf("%s: the engine never dialled again", eps[i].Replica)
				}
				// A later turn of a missed prompt: the index agrees with the
				// engine's cached_tokens.
				p := append(append([]uint32(nil), missed[i][0]...), engine.SyntheticTokens(nil, 77, 20)...)
				if want, got := overlapOf(x, r, p), complete(t, sims[i], p); got != want || got != 48 {
					t.Errorf("%s after the reconnect: engine cached %d, index %d, want 48", eps[i].Replica, got, want)
				}
				t.Logf("%s: %+v, redials %d", eps[i].Replica, st, sims[i].KVRedials())
			}
		})
	}
}

// TestInteropOrphanFeedFallsBack: an engine whose every BlockStored names a
// parent no block has (enginesim OrphanParents) delivers events, none of
// which land. Its feed is flagged unhealthy within seconds, its replica
// falls back to the estimate (no precise annotation), and nothing is
// indexed; the healthy engine beside it stays precise.
func TestInteropOrphanFeedFallsBack(t *testing.T) {
	x := New(Config{BlockSize: 16})
	var sims []*enginesim.Server
	for _, orphan := range []bool{true, false} {
		sim, err := enginesim.Start(context.Background(), enginesim.Options{Instant: true,
			Engine:   engine.Config{BlockSize: 16, CapacityTokens: 1024 * 16},
			KVEvents: enginesim.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", OrphanParents: orphan}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Close() })
		sims = append(sims, sim)
	}
	startSub(t, x, Endpoint{Replica: "orphans", Events: sims[0].KVEndpoints()[0]},
		Endpoint{Replica: "good", Events: sims[1].KVEndpoints()[0]})
	bad, _ := x.Lookup("orphans")
	good, _ := x.Lookup("good")
	warmUp(t, x, good, sims[1], 1000)

	start := time.Now()
	var flagged time.Duration
	for i := 0; flagged == 0; i++ {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("orphan feed not flagged after %d requests: %+v", i, x.Stats(bad))
		}
		complete(t, sims[0], engine.SyntheticTokens(nil, uint64(2000+i), 48))
		if st := x.Stats(bad); st.Messages > 0 && !st.Healthy {
			flagged = time.Since(start)
		}
	}
	st := x.Stats(bad)
	if st.Fresh || st.Entries != 0 || x.Orphans() == 0 {
		t.Fatalf("orphan feed: %+v, orphans %d", st, x.Orphans())
	}
	if flagged > 10*time.Second {
		t.Errorf("flagged after %v", flagged)
	}
	// Its replica is routed by the estimate; the healthy one precisely.
	p := engine.SyntheticTokens(nil, 3000, 48)
	complete(t, sims[0], p)
	complete(t, sims[1], p)
	eventually(t, "the healthy engine's store indexed", func() bool { return overlapOf(x, good, p) == 48 })
	cands := make([]selection.Candidate, 2)
	x.Annotate(x.Keys(nil, 0, p), []Replica{bad, good}, cands, make([]int, 2))
	if cands[0].Precise || !cands[1].Precise || cands[1].Overlap != 48 {
		t.Fatalf("annotation %+v: want the orphan feed's replica not precise, the healthy one precise with 48", cands)
	}
	t.Logf("flagged after %v (%d orphans); stats %+v", flagged, x.Orphans(), st)
}

// TestColdOnlyWithAHealthyFeed: the cold start (Precise.Cold, which sends
// a background preflight per request) needs a connected feed that is not
// found unhealthy: an engine whose every store is an orphan ends it within
// seconds, so a misconfigured fleet does not tokenize every request for
// nothing.
func TestColdOnlyWithAHealthyFeed(t *testing.T) {
	sim, err := enginesim.Start(context.Background(), enginesim.Options{Instant: true,
		Engine:   engine.Config{BlockSize: 16, CapacityTokens: 1024 * 16},
		KVEvents: enginesim.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", OrphanParents: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	p, err := NewPrecise(PreciseConfig{Index: Config{BlockSize: 16},
		Engines:    []PreciseEngine{{Feed: Endpoint{Replica: "orphans", Events: sim.KVEndpoints()[0]}, BaseURL: sim.URL()}},
		Subscriber: SubscriberConfig{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Cold() {
		t.Fatal("cold before any feed connected")
	}
	p.Start(context.Background())
	t.Cleanup(func() { p.Close() })
	r, _ := p.Index().Lookup("orphans")
	eventually(t, "the feed connected, the cold start on", func() bool { return p.Index().Stats(r).Connected && p.Cold() })
	for i := 0; p.Index().Stats(r).Healthy; i++ {
		if i == 2000 {
			t.Fatalf("orphan feed never flagged: %+v", p.Index().Stats(r))
		}
		complete(t, sim, engine.SyntheticTokens(nil, uint64(2000+i), 48))
		eventuallyTick()
	}
	if p.Cold() || p.Ready() {
		t.Fatalf("cold %v ready %v with the only feed unhealthy: %+v", p.Cold(), p.Ready(), p.Index().Stats(r))
	}
}
