package kvindex

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/selection"
)

// Endpoint is one event feed: the ZMQ PUB socket of one engine (one data-
// parallel rank), and optionally its replay ROUTER socket.
type Endpoint struct {
	// Replica is the id the feed's blocks are recorded under in the Index,
	// e.g. "10.0.0.5:8000#1"; it must match the router's replica key.
	Replica string
	// Events is the PUB address, e.g. "tcp://10.0.0.5:5557".
	Events string
	// Replay is the replay ROUTER address, e.g. "tcp://10.0.0.5:5558";
	// empty when the engine has none (gaps then fence the replica).
	Replay string
	// Topic is the subscription prefix; empty subscribes to everything.
	Topic string
	// Bind makes Events an address this subscriber binds and the engine's
	// PUB socket connects to (vLLM with a non-"*" endpoint, llm-d's usual
	// setup), instead of one it dials (vLLM's default "tcp://*:5557").
	// Several endpoints may share one bound address; their messages are
	// told apart by topic, so each needs a distinct non-empty Topic there
	// (e.g. llm-d's "kv@<pod-ip>:<port>@<model>").
	Bind bool
	// Resolvers, when set, are the DNS servers the host names of Events
	// and Replay are resolved with before each dial (resolve.go).
	Resolvers []string
}

// RankEndpoint returns the endpoint of data-parallel rank rank of an engine
// whose rank-0 sockets are events and replay: vLLM offsets the TCP port of
// both by the rank. The replica id is selection.ReplicaKey(base, rank).
func RankEndpoint(base, events, replay, topic string, rank int) (Endpoint, error) {
	ev, err := offsetPort(events, rank)
	if err != nil {
		return Endpoint{}, err
	}
	rp := ""
	if replay != "" {
		if rp, err = offsetPort(replay, rank); err != nil {
			return Endpoint{}, err
		}
	}
	return Endpoint{Replica: selection.ReplicaKey(base, rank), Events: ev, Replay: rp, Topic: topic}, nil
}

func offsetPort(ep string, rank int) (string, error) {
	if !strings.HasPrefix(ep, "tcp://") {
		return "", fmt.Errorf("kvindex: endpoint %q: want tcp://host:port", ep)
	}
	host, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return "", fmt.Errorf("kvindex: endpoint %q: %w", ep, err)
	}
	p, err := strconv.Atoi(port)
	if err == nil && p == 0 {
		// Port 0 (a bound endpoint on a port the system picks, see
		// Subscriber.BoundAddr): every rank shares it, told apart by topic.
		return ep, nil
	}
	if err != nil || p <= 0 || p+rank > 65535 {
		return "", fmt.Errorf("kvindex: endpoint %q: bad port", ep)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+rank)), nil
}

// SubscriberConfig tunes a Subscriber. Zero values take the defaults.
type SubscriberConfig struct {
	// MinBackoff and MaxBackoff bound the wait between reconnection
	// attempts, which doubles from min to max. Defaults 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// DialTimeout bounds one connection attempt. Default 2s.
	DialTimeout time.Duration
	// ReplayTimeout bounds one replay request, from the request to the last
	// missing message. Default 1s.
	ReplayTimeout time.Duration
	// Logger receives connection state changes; nil logs nothing.
	Logger *zap.Logger
	// Handover, when set, hands each bound address over between the
	// subscribers of the same key (a config reload's old and new): the
	// next one listens on the port the previous one was given, port 0
	// configured or not, once the previous one closed it (handover.go).
	Handover string
}

func (c *SubscriberConfig) setDefaults() {
	if c.MinBackoff <= 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(5*time.Second, c.MinBackoff)
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 2 * time.Second
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = time.Second
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
}

// Subscriber keeps one ZMQ SUB connection per Endpoint and applies the
// events to an Index. It checks sequence numbers: a gap is filled from the
// replay socket when one is configured, else (and on a reset, a lost
// connection or an undecodable message) the replica is fenced.
type Subscriber struct {
	x    *Index
	cfg  SubscriberConfig
	eps  []Endpoint
	reps []Replica

	// binds groups the bound endpoints by address (indexes into eps).
	binds     map[string][]int
	bindOrder []string

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
	bound  map[string]string // bound address -> actual address, once listening
}

// NewSubscriber registers every endpoint's replica in x and returns a
// Subscriber for them; Start connects.
func NewSubscriber(x *Index, eps []Endpoint, cfg SubscriberConfig) (*Subscriber, error) {
	cfg.setDefaults()
	s := &Subscriber{x: x, cfg: cfg, eps: eps}
	seen := map[string]bool{}
	for _, ep := range eps {
		if ep.Replica == "" || ep.Events == "" {
			return nil, errors.New("kvindex: endpoint needs a replica id and an events address")
		}
		if seen[ep.Replica] {
			return nil, fmt.Errorf("kvindex: replica %q listed twice", ep.Replica)
		}
		seen[ep.Replica] = true
		if ep.Bind {
			if s.binds == nil {
				s.binds = map[string][]int{}
			}
			g := s.binds[ep.Events]
			for _, j := range g {
				if eps[j].Topic == ep.Topic {
					return nil, fmt.Errorf("kvindex: replicas %q and %q bind %s with the same topic %q; give each engine its own topic",
						eps[j].Replica, ep.Replica, ep.Events, ep.Topic)
				}
			}
			if len(g) == 0 {
				s.bindOrder = append(s.bindOrder, ep.Events)
			}
			s.binds[ep.Events] = append(g, len(s.reps))
		}
		r, err := x.Register(ep.Replica)
		if err != nil {
			return nil, err
		}
		s.reps = append(s.reps, r)
	}
	return s, nil
}

// Start starts one goroutine per endpoint; they run until ctx ends or Close.
// Start may be called once.
func (s *Subscriber) Start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return
	}
	ctx, s.cancel = context.WithCancel(ctx)
	for _, addr := range s.bindOrder {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.runBind(ctx, addr, s.binds[addr])
		}()
	}
	for i := range s.eps {
		if s.eps[i].Bind {
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.run(ctx, s.eps[i], s.reps[i])
		}()
	}
}

// Close stops every goroutine and closes every socket; it waits for them.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// discard silences zmq4's own logging.
var discard = log.New(io.Discard, "", 0)

func (s *Subscriber) run(ctx context.Context, ep Endpoint, r Replica) {
	lg := s.cfg.Logger.With(zap.String("replica", ep.Replica), zap.String("events", ep.Events))
	backoff := s.cfg.MinBackoff
	f := &feed{dec: NewDecoder(), rdec: NewDecoder()}
	for ctx.Err() == nil {
		connected, err := s.session(ctx, ep, r, f)
		if ctx.Err() != nil {
			return
		}
		if connected {
			// Whatever happened while disconnected is unknown.
			s.x.Fence(r, FenceReconnect)
			f.have = false
			lg.Warn("kv event feed lost; replica fenced", zap.Error(err))
			backoff = s.cfg.MinBackoff
		} else if ce := lg.Check(zap.DebugLevel, "kv event feed unreachable"); ce != nil {
			ce.Write(zap.Error(err), zap.Duration("retry_in", backoff))
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

// BoundAddr returns the address a bound endpoint address (Endpoint.Events
// with Bind) is listening on, e.g. with its port when bound to port 0;
// empty until it listens.
func (s *Subscriber) BoundAddr(events string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bound[events]
}

// runBind listens on addr for the engines of the endpoints eps (indexes
// into s.eps) and dispatches their messages by topic, relistening after a
// failure.
func (s *Subscriber) runBind(ctx context.Context, addr string, idx []int) {
	lg := s.cfg.Logger.With(zap.String("bind", addr))
	feeds := make([]*feed, len(idx))
	for i := range feeds {
		feeds[i] = &feed{dec: NewDecoder(), rdec: NewDecoder()}
	}
	backoff := s.cfg.MinBackoff
	for ctx.Err() == nil {
		err := s.bindSession(ctx, addr, idx, feeds)
		if ctx.Err() != nil {
			return
		}
		for i, j := range idx {
			s.x.Fence(s.reps[j], FenceReconnect)
			feeds[i].have = false
		}
		lg.Warn("kv event socket lost; its replicas fenced", zap.Error(err), zap.Duration("retry_in", backoff))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

func (s *Subscriber) bindSession(ctx context.Context, addr string, idx []int, feeds []*feed) error {
	sub, err := s.listen(ctx, addr)
	if err != nil {
		return err
	}
	actual := "tcp://" + sub.Addr().String()
	release := holdBound(s.cfg.Handover, addr, actual)
	defer func() {
		CloseDrained(sub) // closes the listener: the next subscriber may listen
		release()
	}()
	s.mu.Lock()
	if s.bound == nil {
		s.bound = map[string]string{}
	}
	s.bound[addr] = actual
	s.mu.Unlock()
	for _, j := range idx {
		if err := sub.SetOption(zmq4.OptionSubscribe, s.eps[j].Topic); err != nil {
			return fmt.Errorf("subscribe: %w", err)
		}
	}
	up := make([]bool, len(idx))
	defer func() {
		for i, j := range idx {
			if up[i] {
				s.x.noteConnected(s.reps[j], false)
			}
		}
	}()
	var unknown uint64
	lost := 0 // publishers' connections lost in a row, no message between
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil || lost >= maxLostInARow {
				return fmt.Errorf("receive: %w", err)
			}
			// zmq4 reports one publisher's lost connection as a receive
			// error; the socket still listens and the other publishers'
			// connections are up, so nothing is fenced here. The publisher
			// redials (libzmq does, forever); its next message is then past
			// the sequence its feed knows, a gap filled from its replay
			// socket, or restarts it (an engine restart), a reset.
			lost++
			s.cfg.Logger.Info("kv event publisher disconnected from the bound socket; a gap in its sequence is replayed when it reconnects",
				zap.String("bind", addr), zap.Error(err))
			continue
		}
		lost = 0
		i := topicOf(s.eps, idx, msg.Frames)
		if i < 0 {
			if unknown++; unknown == 1 {
				lg := s.cfg.Logger
				if len(msg.Frames) > 0 {
					lg.Warn("kv event from a topic no endpoint of this bind address has; dropped",
						zap.String("bind", addr), zap.ByteString("topic", msg.Frames[0]))
				}
			}
			continue
		}
		j := idx[i]
		if !up[i] {
			up[i] = true
			s.x.noteConnected(s.reps[j], true)
		}
		s.handle(ctx, s.eps[j], s.reps[j], feeds[i], msg.Frames)
	}
}

// listen returns a SUB socket listening on the configured bound address
// addr, or on the address the previous subscriber of the same handover key
// listened on for it (waiting until it let it go); if that one was taken
// meanwhile, on addr.
func (s *Subscriber) listen(ctx context.Context, addr string) (zmq4.Socket, error) {
	at, err := handoverAddr(ctx, s.cfg.Handover, addr, func(held string) {
		s.cfg.Logger.Info("kv event socket: waiting for the previous subscriber (a config reload) to hand over its address",
			zap.String("bind", addr), zap.String("address", held))
	})
	if err != nil {
		return nil, err
	}
	sub := zmq4.NewSub(ctx, zmq4.WithLogger(discard))
	err = sub.Listen(at)
	if err != nil && at != addr {
		sub.Close()
		s.cfg.Logger.Warn("kv event socket: the previous subscriber's address is taken; listening on the configured one",
			zap.String("bind", addr), zap.String("address", at), zap.Error(err))
		sub = zmq4.NewSub(ctx, zmq4.WithLogger(discard))
		err = sub.Listen(addr)
	}
	if err != nil {
		sub.Close()
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return sub, nil
}

// CloseDrained closes a SUB or DEALER socket, then empties its queue.
// zmq4 v0.17.0's reader goroutines (qreader.listen, one per connection)
// check the socket's context before, not while, handing a message to the
// socket's 10-message queue: one already waiting on a full queue when the
// socket closes waits for good, a goroutine and a message left behind per
// close (a config reload, a reconnect) while engines publish. Taking a
// message from the full queue moves the waiting one in, and that
// goroutine then sees the closed socket and returns. After Close each
// Recv returns a queued message or the closed context's error, picked at
// random when both are ready, so the drain ends after 32 errors in a row:
// a message left queued past that is a 2^-32 chance.
func CloseDrained(sock zmq4.Socket) {
	sock.Close()
	for errs := 0; errs < 32; {
		if _, err := sock.Recv(); err != nil {
			errs++
		} else {
			errs = 0
		}
	}
}

// maxLostInARow bounds the receive errors a bound socket takes in a row,
// with no message between, before it is taken for broken (its replicas
// fenced, the address listened on again): each lost connection reports
// one.
const maxLostInARow = 64

// topicOf returns the index into idx of the endpoint a message belongs
// to: the one whose topic equals the message's, else the longest one that
// is a prefix of it; -1 if none.
func topicOf(eps []Endpoint, idx []int, frames [][]byte) int {
	if len(frames) != 3 {
		return -1
	}
	best, bestLen := -1, -1
	for i, j := range idx {
		t := eps[j].Topic
		if string(frames[0]) == t {
			return i
		}
		if len(t) > bestLen && bytes.HasPrefix(frames[0], []byte(t)) {
			best, bestLen = i, len(t)
		}
	}
	return best
}

// feed is the sequence state of one endpoint, owned by its goroutine.
type feed struct {
	dec, rdec *Decoder
	last      uint64
	have      bool
}

// session connects once and applies messages until the connection fails.
func (s *Subscriber) session(ctx context.Context, ep Endpoint, r Replica, f *feed) (bool, error) {
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.DialTimeout),
		zmq4.WithLogger(discard))
	defer CloseDrained(sub)
	addr, err := resolveEndpoint(ctx, ep.Events, ep.Resolvers)
	if err != nil {
		return false, err
	}
	if err := sub.Dial(addr); err != nil {
		return false, fmt.Errorf("dial %s: %w", ep.Events, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ep.Topic); err != nil {
		return false, fmt.Errorf("subscribe: %w", err)
	}
	s.x.noteConnected(r, true)
	defer s.x.noteConnected(r, false)
	for {
		msg, err := sub.Recv()
		if err != nil {
			return true, fmt.Errorf("receive: %w", err)
		}
		s.handle(ctx, ep, r, f, msg.Frames)
	}
}

// handle checks one message's sequence number and applies it.
func (s *Subscriber) handle(ctx context.Context, ep Endpoint, r Replica, f *feed, frames [][]byte) {
	m, err := f.dec.DecodeFrames(frames)
	if err != nil {
		s.x.noteDecodeError(r)
		s.x.Fence(r, FenceDecode)
		// Keep the sequence if it was readable, so the next message is
		// not taken for a gap.
		if len(frames) == 3 && len(frames[1]) == 8 {
			f.last, f.have = binary.BigEndian.Uint64(frames[1]), true
		}
		return
	}
	seq := m.Seq
	switch {
	case !f.have && seq <= firstSeq:
		// The engine's first message (vLLM counts from 0, others from 1;
		// a 1 from an engine counting from 0 is caught up by the replay).
		if seq == 1 && ep.Replay != "" {
			s.replay(ctx, ep, r, f, 0, 1, false)
		}
		s.x.noteStart(r)
	case !f.have:
		// Joining a running engine: catch up on what its replay buffer
		// still holds (all of it if the engine is young). Whatever is older
		// is unknown; it stays out of the index.
		if ep.Replay != "" && seq > 0 {
			s.replay(ctx, ep, r, f, 0, seq, false)
		}
	case seq == f.last+1:
	case seq <= f.last:
		s.x.Fence(r, FenceReset)
		if seq <= firstSeq {
			s.x.noteStart(r)
		}
	default:
		s.x.noteGap(r)
		if ep.Replay == "" || !s.replay(ctx, ep, r, f, f.last+1, seq, true) {
			s.x.Fence(r, FenceGap)
		}
	}
	s.x.Apply(r, &m.Batch)
	s.x.noteMessage(r, seq)
	f.last, f.have = seq, true
	s.logHealth(ep, r)
}

// logHealth logs a transition of r's feed health, once.
func (s *Subscriber) logHealth(ep Endpoint, r Replica) {
	changed, reason := s.x.HealthChange(r)
	if !changed {
		return
	}
	if reason != "" {
		s.cfg.Logger.Warn("kv event feed unhealthy: its stores do not land in the index; replica routed by the estimate",
			zap.String("replica", ep.Replica), zap.String("events", ep.Events), zap.String("reason", reason))
		return
	}
	s.cfg.Logger.Info("kv event feed healthy again", zap.String("replica", ep.Replica),
		zap.String("events", ep.Events))
}

// firstSeq is the highest sequence number an engine's first message
// carries: vLLM counts from 0, other publishers from 1.
const firstSeq = 1

// replay asks ep's replay socket for messages from .. upTo-1 and applies
// them in order. When strict, the reply must start at from; otherwise it may
// start later (the buffer lost the oldest), and must be contiguous from its
// first message on. It reports whether every message up to upTo-1 came; a
// replay that did not is logged and counted (Index.ReplayFailures).
func (s *Subscriber) replay(ctx context.Context, ep Endpoint, r Replica, f *feed, from, upTo uint64, strict bool) bool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	defer cancel()
	next, n := from, 0
	fail := func(err error) bool {
		s.x.noteReplayFailure(r)
		s.cfg.Logger.Warn("kv event replay incomplete", zap.String("replica", ep.Replica),
			zap.String("replay", ep.Replay), zap.Uint64("from", from), zap.Uint64("up_to", upTo),
			zap.Int("applied", n), zap.Error(err))
		return false
	}
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.DialTimeout),
		zmq4.WithLogger(discard), zmq4.WithTimeout(s.cfg.ReplayTimeout))
	defer CloseDrained(d)
	addr, err := resolveEndpoint(ctx, ep.Replay, ep.Resolvers)
	if err != nil {
		return fail(err)
	}
	if err := d.Dial(addr); err != nil {
		return fail(fmt.Errorf("dial %s: %w", ep.Replay, err))
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	// A DEALER sends the empty delimiter a REQ socket would add.
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return fail(fmt.Errorf("request: %w", err))
	}
	if !strict {
		s.x.beginJoin(r)
	}
	defer func() { s.x.endReplay(r, n) }()
	for next < upTo {
		msg, err := d.Recv()
		if err != nil {
			return fail(fmt.Errorf("receive: %w", err))
		}
		seq, frames, end, err := SplitReplay(msg.Frames)
		if err != nil {
			return fail(err)
		}
		if end {
			if !strict && n == 0 {
				return false // joining: the buffer holds nothing older
			}
			return fail(fmt.Errorf("reply ended at %d, before %d", next, upTo))
		}
		if seq < next {
			continue
		}
		if seq > next {
			if !strict && n == 0 && seq >= upTo {
				return false // joining: the buffer holds nothing older
			}
			if strict || n > 0 {
				return fail(fmt.Errorf("buffer starts at %d, need %d", seq, next))
			}
			next = seq
		}
		m, err := f.rdec.DecodeFrames(frames)
		if err != nil {
			s.x.noteDecodeError(r)
			return fail(err)
		}
		if seq <= firstSeq && n == 0 && !f.have {
			s.x.noteStart(r)
		}
		s.x.Apply(r, &m.Batch)
		s.x.noteMessage(r, seq)
		f.last = seq
		next++
		n++
	}
	return true
}
