package enginesim

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
	"github.com/vmihailenco/msgpack/v5"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// KVEncoding selects how events and batches are serialised, following
// the two shapes vLLM has published.
type KVEncoding string

const (
	// KVEncodingArray is the positional form (msgspec array_like=True, as
	// in vLLM releases up to v0.10): the batch is [ts, events, dp_rank] and
	// each event is [tag, fields...], e.g.
	// ["BlockStored", block_hashes, parent_block_hash, token_ids,
	// block_size, lora_id, medium].
	KVEncodingArray KVEncoding = "array"
	// KVEncodingMap is the keyed form of later vLLM releases: the batch is
	// {"ts", "events", "data_parallel_rank"} and each event a map with
	// "type" as its tag.
	KVEncodingMap KVEncoding = "map"
)

// HashEncoding selects how block hashes are written.
type HashEncoding string

const (
	// HashUint writes hashes as msgpack unsigned integers (vLLM's int hashes).
	HashUint HashEncoding = "uint"
	// HashInt writes hashes as signed 64-bit integers (negative above 2^63).
	HashInt HashEncoding = "int"
	// HashBytes writes hashes as 8-byte big-endian binary (vLLM's bytes
	// hashes are digests; consumers treat them as opaque bytes).
	HashBytes HashEncoding = "bytes"
)

// KVMedium is the medium every event reports.
const KVMedium = "GPU"

// EncodeKVBatch encodes one event batch as vLLM's KVEventBatch payload
// (the third frame of a published message).
func EncodeKVBatch(enc KVEncoding, hashes HashEncoding, ts float64, events []engine.KVEvent, dpRank int) ([]byte, error) {
	return encodeKVBatch(enc, hashes, parentConvention{}, ts, events, dpRank)
}

// parentConvention is how a publisher writes parent_block_hash.
type parentConvention struct {
	// zero writes a chain start's parent as 0 instead of nil (some
	// emulators' convention).
	zero bool
	// orphan writes every parent as a hash no block has (see
	// KVEventsOptions.OrphanParents).
	orphan bool
}

// orphanMask turns a real hash into one no block has (with overwhelming
// probability).
const orphanMask = 0x9e3779b97f4a7c15

// encodeKVBatch is EncodeKVBatch with the publisher's parent convention.
func encodeKVBatch(enc KVEncoding, hashes HashEncoding, pc parentConvention, ts float64, events []engine.KVEvent, dpRank int) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	w := &kvWriter{e: e, hashes: hashes, parent: pc}
	if enc == KVEncodingMap {
		w.mapLen(3)
		w.str("ts")
		w.err1(e.EncodeFloat64(ts))
		w.str("events")
	} else {
		w.arrayLen(3)
		w.err1(e.EncodeFloat64(ts))
	}
	w.arrayLen(len(events))
	for _, ev := range events {
		w.event(enc, ev)
	}
	if enc == KVEncodingMap {
		w.str("data_parallel_rank")
	}
	w.err1(e.EncodeInt(int64(dpRank)))
	if w.err != nil {
		return nil, fmt.Errorf("encode kv batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

type kvWriter struct {
	e      *msgpack.Encoder
	hashes HashEncoding
	parent parentConvention
	err    error
}

func (w *kvWriter) err1(err error) {
	if w.err == nil {
		w.err = err
	}
}
func (w *kvWriter) str(s string)   { w.err1(w.e.EncodeString(s)) }
func (w *kvWriter) arrayLen(n int) { w.err1(w.e.EncodeArrayLen(n)) }
func (w *kvWriter) mapLen(n int)   { w.err1(w.e.EncodeMapLen(n)) }
func (w *kvWriter) nil_()          { w.err1(w.e.EncodeNil()) }
func (w *kvWriter) uint(n uint64)  { w.err1(w.e.EncodeUint(n)) }
func (w *kvWriter) key(enc KVEncoding, k string) {
	if enc == KVEncodingMap {
		w.str(k)
	}
}

func (w *kvWriter) hash(h uint64) {
	switch w.hashes {
	case HashInt:
		w.err1(w.e.EncodeInt(int64(h)))
	case HashBytes:
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], h)
		w.err1(w.e.EncodeBytes(b[:]))
	default:
		w.uint(h)
	}
}

func (w *kvWriter) hashList(hs []uint64) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *kvWriter) event(enc KVEncoding, ev engine.KVEvent) {
	n := map[engine.KVEventKind]int{engine.BlockStored: 7, engine.BlockRemoved: 3, engine.AllBlocksCleared: 1}[ev.Kind]
	if enc == KVEncodingMap {
		if ev.Kind == engine.BlockStored {
			n = 8 // lora_name as well
		}
		w.mapLen(n)
		w.str("type")
	} else {
		w.arrayLen(n)
	}
	w.str(ev.Kind.String())
	switch ev.Kind {
	case engine.BlockStored:
		w.key(enc, "block_hashes")
		w.hashList(ev.BlockHashes)
		w.key(enc, "parent_block_hash")
		switch {
		case w.parent.orphan && len(ev.BlockHashes) > 0:
			w.hash(ev.BlockHashes[0] ^ orphanMask)
		case ev.HasParent:
			w.hash(ev.ParentHash)
		case w.parent.zero:
			w.uint(0)
		default:
			w.nil_()
		}
		w.key(enc, "token_ids")
		w.arrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			w.uint(uint64(t))
		}
		w.key(enc, "block_size")
		w.uint(uint64(ev.BlockSize))
		w.key(enc, "lora_id")
		w.nil_()
		w.key(enc, "medium")
		w.str(KVMedium)
		if enc == KVEncodingMap {
			w.str("lora_name")
			w.nil_()
		}
	case engine.BlockRemoved:
		w.key(enc, "block_hashes")
		w.hashList(ev.BlockHashes)
		w.key(enc, "medium")
		w.str(KVMedium)
	}
}

// OffsetEndpointPort returns endpoint with its TCP port offset by rank, as
// vLLM does for data-parallel ranks ("tcp://*:5557" -> "tcp://*:5558" for
// rank 1). Port 0 stays 0 (each rank picks its own port).
func OffsetEndpointPort(endpoint string, rank int) (string, error) {
	if rank == 0 || endpoint == "" {
		return endpoint, nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	if !strings.HasPrefix(endpoint, "tcp://") || i < 0 {
		return "", fmt.Errorf("kv endpoint %q: want tcp://host:port", endpoint)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil {
		return "", fmt.Errorf("kv endpoint %q: %w", endpoint, err)
	}
	if port == 0 {
		return endpoint, nil
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}

// kvPublisher is one rank's PUB socket, with an optional ROUTER replay
// socket and a bounded replay buffer.
type kvPublisher struct {
	rank   int
	topic  []byte
	enc    KVEncoding
	hashes HashEncoding
	o      KVEventsOptions
	ep     string
	pub    zmq4.Socket
	router zmq4.Socket
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	redials int // connecting PUB sockets replaced by keepConnected
	seq     uint64
	buf     []replayEntry // ring of the last cap entries
	bufCap  int
	head    int
}

type replayEntry struct {
	seq     uint64
	payload []byte
}

func newKVPublisher(ctx context.Context, o KVEventsOptions, rank int) (*kvPublisher, error) {
	p := &kvPublisher{rank: rank, topic: []byte(o.Topic), enc: o.Encoding, hashes: o.HashEncoding,
		bufCap: o.ReplayBuffer, o: o}
	if o.SeqFromOne {
		p.seq = 1
	}
	ep, err := OffsetEndpointPort(o.Endpoint, rank)
	if err != nil {
		return nil, err
	}
	p.ep = ep
	if o.Connect {
		// The PUB connects to a subscriber that binds, and keeps dialling
		// as libzmq's does (keepConnected): a subscriber that is not up
		// yet is no error, the PUB drops what it publishes until then.
		if _, _, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://")); err != nil || !strings.HasPrefix(ep, "tcp://") {
			return nil, fmt.Errorf("kv endpoint %q: want tcp://host:port", ep)
		}
		pub, err := dialPub(ctx, ep, o.HWM, 0)
		dialled := err == nil
		if !dialled {
			pub = zmq4.NewPub(ctx) // a placeholder without peers
		}
		p.pub = pub
		p.wg.Add(1)
		go p.keepConnected(ctx, dialled)
	} else {
		p.pub = zmq4.NewPub(ctx)
		if err := p.pub.SetOption(zmq4.OptionHWM, o.HWM); err != nil {
			p.pub.Close()
			return nil, fmt.Errorf("kv pub hwm: %w", err)
		}
		if err := p.pub.Listen(ep); err != nil {
			p.pub.Close()
			return nil, fmt.Errorf("kv pub listen %s: %w", ep, err)
		}
	}
	if o.ReplayEndpoint != "" {
		rep, err := OffsetEndpointPort(o.ReplayEndpoint, rank)
		if err == nil {
			p.router = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity(fmt.Sprintf("enginesim-replay-%d", rank))))
			err = p.router.Listen(rep)
		}
		if err != nil {
			p.close()
			return nil, fmt.Errorf("kv replay listen: %w", err)
		}
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// Endpoint is the PUB socket's bound address as tcp://host:port.
// With Connect it is the address the PUB connects to.
func (p *kvPublisher) Endpoint() string {
	if p.o.Connect {
		return p.ep
	}
	return "tcp://" + p.pub.Addr().String()
}

// ReplayEndpoint is the ROUTER socket's bound address, or "".
func (p *kvPublisher) ReplayEndpoint() string {
	if p.router == nil {
		return ""
	}
	return "tcp://" + p.router.Addr().String()
}

// publish sends one batch as three frames: topic, 8-byte big-endian
// sequence number, msgpack payload.
func (p *kvPublisher) publish(ts float64, events []engine.KVEvent) error {
	payload, err := encodeKVBatch(p.enc, p.hashes, parentConvention{zero: p.o.ParentZero, orphan: p.o.OrphanParents}, ts, events, p.rank)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], seq)
	if p.bufCap > 0 {
		e := replayEntry{seq: seq, payload: payload}
		if len(p.buf) < p.bufCap {
			p.buf = append(p.buf, e)
		} else {
			p.buf[p.head] = e
			p.head = (p.head + 1) % p.bufCap
		}
	}
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, sb[:], payload)); err != nil {
		return fmt.Errorf("kv publish: %w", err)
	}
	return nil
}

// reset restarts the sequence at 0 and empties the replay buffer (an
// engine restart).
func (p *kvPublisher) reset() {
	p.mu.Lock()
	p.seq, p.buf, p.head = 0, p.buf[:0], 0
	if p.o.SeqFromOne {
		p.seq = 1
	}
	p.mu.Unlock()
}

// serveReplay answers replay requests ([identity, "", start_seq]) with
// every buffered batch from start_seq on ([identity, "", seq, payload])
// and an end marker (seq -1, empty payload), as vLLM's publisher does.
func (p *kvPublisher) serveReplay() {
	defer p.wg.Done()
	end := make([]byte, 8)
	binary.BigEndian.PutUint64(end, ^uint64(0))
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if isClosed(err) {
				return
			}
			continue
		}
		if len(msg.Frames) < 2 || len(msg.Frames[len(msg.Frames)-1]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[len(msg.Frames)-1])
		p.mu.Lock()
		var out []replayEntry
		for i := range p.buf {
			e := p.buf[(p.head+i)%len(p.buf)]
			if e.seq >= start {
				out = append(out, e)
			}
		}
		p.mu.Unlock()
		for _, e := range out {
			var sb [8]byte
			binary.BigEndian.PutUint64(sb[:], e.seq)
			if err := p.router.Send(p.reply(id, sb[:], e.payload)); err != nil {
				break
			}
		}
		_ = p.router.Send(p.reply(id, end, nil))
	}
}

// reply frames one replay reply: [identity, "", seq, payload], or with
// ReplayTopic [identity, "", topic, seq, payload].
func (p *kvPublisher) reply(id, seq, payload []byte) zmq4.Msg {
	if p.o.ReplayTopic {
		return zmq4.NewMsgFrom(id, nil, p.topic, seq, payload)
	}
	return zmq4.NewMsgFrom(id, nil, seq, payload)
}

func isClosed(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, net.ErrClosed)
}

func (p *kvPublisher) close() {
	p.mu.Lock()
	p.closed = true
	p.pub.Close()
	p.mu.Unlock()
	if p.router != nil {
		p.router.Close()
	}
	p.wg.Wait()
}

// The reconnect interval of a connecting PUB: libzmq's ZMQ_RECONNECT_IVL
// default (vLLM leaves it), which libzmq applies forever.
const (
	reconnectIvl = 100 * time.Millisecond
	// pubIdle is how long a connecting PUB may have no subscribed peer
	// before keepConnected dials it again: past a handshake and the
	// subscription message (microseconds on a live connection).
	pubIdle = time.Second
)

// discardLog silences zmq4's own logging (a redial that fails is retried).
var discardLog = log.New(io.Discard, "", 0)

// dialPub makes a PUB socket with high-water mark hwm connected to ep,
// retrying a refused TCP dial up to retries times, reconnectIvl apart.
func dialPub(ctx context.Context, ep string, hwm, retries int) (zmq4.Socket, error) {
	pub := zmq4.NewPub(ctx, zmq4.WithDialerMaxRetries(retries), zmq4.WithDialerRetry(reconnectIvl),
		zmq4.WithLogger(discardLog))
	if err := pub.SetOption(zmq4.OptionHWM, hwm); err != nil {
		pub.Close()
		return nil, fmt.Errorf("kv pub hwm: %w", err)
	}
	if err := pub.Dial(ep); err != nil {
		pub.Close()
		return nil, fmt.Errorf("kv pub dial %s: %w", ep, err)
	}
	return pub, nil
}

// keepConnected keeps a connecting PUB connected to its subscriber as a
// libzmq PUB (vLLM's) does: through a subscriber's restart or a broken
// path it redials every reconnectIvl, forever. zmq4's own reconnect
// (WithAutomaticReconnect) redials once and gives up when that dial or
// its handshake fails, so instead a socket that has had no subscribed
// peer for pubIdle is replaced by a fresh one, dialled again. What is
// published meanwhile is dropped, as a PUB drops it without a subscriber;
// the replay socket still has it.
func (p *kvPublisher) keepConnected(ctx context.Context, dialled bool) {
	defer p.wg.Done()
	t := time.NewTicker(reconnectIvl)
	defer t.Stop()
	var idle time.Duration
	if !dialled {
		idle = pubIdle // dial at the first tick
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		pub, closed := p.pub, p.closed
		p.mu.Unlock()
		if closed {
			return
		}
		if len(pub.(zmq4.Topics).Topics()) > 0 {
			idle = 0
			continue
		}
		if idle += reconnectIvl; idle < pubIdle {
			continue
		}
		np, err := dialPub(ctx, p.ep, p.o.HWM, 0)
		if err != nil {
			continue // the next tick dials again
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			np.Close()
			return
		}
		old := p.pub
		p.pub = np
		p.redials++
		p.mu.Unlock()
		old.Close()
		idle = 0
	}
}

// KVRedials is how many times the ranks' connecting PUB sockets were
// dialled again after losing their subscriber (KVEventsOptions.Connect).
func (s *Server) KVRedials() int {
	n := 0
	for _, r := range s.ranks {
		if r.pub != nil {
			r.pub.mu.Lock()
			n += r.pub.redials
			r.pub.mu.Unlock()
		}
	}
	return n
}
