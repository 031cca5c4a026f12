package kvindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// EventKind is the type of one KV-cache event.
type EventKind uint8

const (
	// KindUnknown is an event whose tag this decoder does not know; it is
	// skipped.
	KindUnknown EventKind = iota
	// KindBlockStored reports blocks newly held by the engine.
	KindBlockStored
	// KindBlockRemoved reports blocks the engine evicted.
	KindBlockRemoved
	// KindAllBlocksCleared reports that the engine dropped its whole cache.
	KindAllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case KindBlockStored:
		return "BlockStored"
	case KindBlockRemoved:
		return "BlockRemoved"
	case KindAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one decoded KV-cache event. Engine block hashes are carried as
// uint64: integer hashes as their 64-bit two's-complement value, byte-string
// hashes (vLLM's sha256-based ones) as the xxhash of their bytes. They are
// only ever compared with each other.
type Event struct {
	Kind EventKind
	// BlockHashes are the engine's hashes of the blocks stored or removed,
	// in chain order.
	BlockHashes []uint64
	// Parent is the engine hash of the block before the first stored one;
	// HasParent is false for the first block of a sequence.
	Parent    uint64
	HasParent bool
	// TokenIDs are the token ids of the stored blocks, BlockSize per block.
	TokenIDs  []uint32
	BlockSize int
	// LoraID is the LoRA adapter id, when HasLora.
	LoraID  int64
	HasLora bool
	// Medium is the storage tier ("GPU", "CPU", ...); empty when absent.
	Medium string
	// GroupIdx is the KV-cache group of hybrid models; 0 when absent.
	GroupIdx int64
}

// Batch is one published message: a timestamp, its events and, when the
// publisher sets it, the data-parallel rank.
type Batch struct {
	TS        float64
	Events    []Event
	DPRank    int64
	HasDPRank bool
}

// Message is one ZMQ multipart message of the event stream, decoded.
type Message struct {
	Topic []byte
	Seq   uint64
	Batch Batch
}

// ErrDecode wraps every decoding failure, so that callers can count them.
var ErrDecode = errors.New("kvindex: undecodable event message")

// MaxPayloadBytes bounds the msgpack payload of one message; larger ones
// are refused undecoded. (A real batch is a few kilobytes.)
const MaxPayloadBytes = 16 << 20

// keepArena is the arena capacity a Decoder keeps between messages; larger
// arenas, grown by an unusually big batch, are released.
const keepArena = 1 << 16

// Decoder decodes event messages, reusing its buffers between calls. A
// Decoder is not safe for concurrent use; the events it returns are valid
// until its next call.
type Decoder struct {
	r   bytes.Reader
	d   *msgpack.Decoder
	msg Message
	// arena holds the hashes and token ids of all events of one batch.
	hashes []uint64
	tokens []uint32
	spans  []spans
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	return &Decoder{d: msgpack.NewDecoder(nil)}
}

// DecodeFrames decodes the frames of one multipart message: [topic, seq,
// payload] where seq is 8 bytes big-endian. Replies of the replay socket,
// [seq, payload], are accepted too.
func (dc *Decoder) DecodeFrames(frames [][]byte) (*Message, error) {
	var topic, seq, payload []byte
	switch len(frames) {
	case 3:
		topic, seq, payload = frames[0], frames[1], frames[2]
	case 2:
		seq, payload = frames[0], frames[1]
	default:
		return nil, fmt.Errorf("%w: %d frames, want 3", ErrDecode, len(frames))
	}
	if len(seq) != 8 {
		return nil, fmt.Errorf("%w: sequence frame of %d bytes, want 8", ErrDecode, len(seq))
	}
	if err := dc.DecodeBatch(payload); err != nil {
		return nil, err
	}
	dc.msg.Topic = topic
	dc.msg.Seq = binary.BigEndian.Uint64(seq)
	return &dc.msg, nil
}

// ReplayEnd is the sequence number that ends a replay reply (-1 as a
// signed 64-bit integer); its payload is empty.
const ReplayEnd = ^uint64(0)

// SplitReplay takes one reply of a replay ROUTER socket as a DEALER
// receives it and returns its sequence number and its message frames in
// DecodeFrames' form. Both framings in the field are accepted: vLLM's
// ["", seq, payload] and, with a topic frame, ["", topic, seq, payload]
// (the empty delimiter is optional). end is true for the end marker
// (sequence ReplayEnd), which carries no payload.
func SplitReplay(frames [][]byte) (seq uint64, msg [][]byte, end bool, err error) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	var sq []byte
	switch len(frames) {
	case 2:
		sq = frames[0]
	case 3:
		sq = frames[1]
	default:
		return 0, nil, false, fmt.Errorf("%w: replay reply of %d frames, want 2 or 3 after the delimiter", ErrDecode, len(frames))
	}
	if len(sq) != 8 {
		return 0, nil, false, fmt.Errorf("%w: replay sequence frame of %d bytes, want 8", ErrDecode, len(sq))
	}
	seq = binary.BigEndian.Uint64(sq)
	return seq, frames, seq == ReplayEnd, nil
}

// Batch returns the batch decoded by the last successful call.
func (dc *Decoder) Batch() *Batch { return &dc.msg.Batch }

// DecodeBatch decodes one msgpack batch: [ts, events, dp_rank] or
// [ts, events] (positional), or {"ts", "events", "data_parallel_rank"}
// (map). Unknown trailing fields and unknown map keys are skipped.
func (dc *Decoder) DecodeBatch(payload []byte) (err error) {
	if len(payload) > MaxPayloadBytes {
		return fmt.Errorf("%w: payload of %d bytes", ErrDecode, len(payload))
	}
	if cap(dc.tokens) > keepArena {
		dc.tokens = nil
	}
	if cap(dc.hashes) > keepArena {
		dc.hashes = nil
	}
	dc.r.Reset(payload)
	dc.d.Reset(&dc.r)
	b := &dc.msg.Batch
	*b = Batch{Events: b.Events[:0]}
	dc.hashes, dc.tokens, dc.spans = dc.hashes[:0], dc.tokens[:0], dc.spans[:0]
	if err := dc.batch(b); err != nil {
		return fmt.Errorf("%w: %w", ErrDecode, err)
	}
	if dc.r.Len() != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrDecode, dc.r.Len())
	}
	dc.fixSlices(b)
	return nil
}

// fixSlices points every event's slices into the arenas once they stopped
// growing (events record offsets in dc.spans while decoding).
func (dc *Decoder) fixSlices(b *Batch) {
	for i := range b.Events {
		e, sp := &b.Events[i], dc.spans[i]
		e.BlockHashes = dc.hashes[sp.h.lo:sp.h.hi:sp.h.hi]
		e.TokenIDs = dc.tokens[sp.t.lo:sp.t.hi:sp.t.hi]
	}
}

func (dc *Decoder) batch(b *Batch) error {
	d := dc.d
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	if isMap(c) {
		n, err := d.DecodeMapLen()
		if err != nil {
			return err
		}
		seen := false
		for i := 0; i < n; i++ {
			key, err := d.DecodeString()
			if err != nil {
				return fmt.Errorf("batch key: %w", err)
			}
			switch key {
			case "ts":
				b.TS, err = number(d)
			case "events":
				seen = true
				err = dc.events(b)
			case "data_parallel_rank":
				b.DPRank, b.HasDPRank, err = optInt(d)
			default:
				err = d.Skip()
			}
			if err != nil {
				return fmt.Errorf("batch %s: %w", key, err)
			}
		}
		if !seen {
			return errors.New("batch without events")
		}
		return nil
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("batch of %d fields, want at least 2", n)
	}
	if b.TS, err = number(d); err != nil {
		return fmt.Errorf("batch ts: %w", err)
	}
	if err := dc.events(b); err != nil {
		return fmt.Errorf("batch events: %w", err)
	}
	if n >= 3 {
		if b.DPRank, b.HasDPRank, err = optInt(d); err != nil {
			return fmt.Errorf("batch dp_rank: %w", err)
		}
	}
	return skipN(d, n-3)
}

func (dc *Decoder) events(b *Batch) error {
	d := dc.d
	n, err := d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 0 {
		return errors.New("events is nil")
	}
	for i := 0; i < n; i++ {
		var e Event
		if err := dc.event(&e); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, e)
	}
	return nil
}

// span is a range of an arena.
type span struct{ lo, hi int }

// spans are the arena ranges of one event's hashes and token ids.
type spans struct{ h, t span }

func (dc *Decoder) event(e *Event) error {
	d := dc.d
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	var hs, ts span
	if isMap(c) {
		n, err := d.DecodeMapLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			key, err := d.DecodeString()
			if err != nil {
				return fmt.Errorf("event key: %w", err)
			}
			if key == "type" {
				tag, err := d.DecodeString()
				if err != nil {
					return fmt.Errorf("event type: %w", err)
				}
				e.Kind = kindOf(tag)
				continue
			}
			if err := dc.field(e, key, &hs, &ts); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
		if e.Kind == KindUnknown && n == 0 {
			return errors.New("event without type")
		}
		dc.spans = append(dc.spans, spans{hs, ts})
		return nil
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n < 1 {
		return errors.New("event without tag")
	}
	tag, err := d.DecodeString()
	if err != nil {
		return fmt.Errorf("event tag: %w", err)
	}
	e.Kind = kindOf(tag)
	var fields []string
	switch e.Kind {
	case KindBlockStored:
		fields = storedFields
	case KindBlockRemoved:
		fields = removedFields
	}
	rest := n - 1
	for i := 0; i < rest; i++ {
		if i >= len(fields) {
			if err := d.Skip(); err != nil {
				return err
			}
			continue
		}
		if err := dc.field(e, fields[i], &hs, &ts); err != nil {
			return fmt.Errorf("%s: %w", fields[i], err)
		}
	}
	dc.spans = append(dc.spans, spans{hs, ts})
	return nil
}

// The positional field order of vLLM's array_like events after the tag.
var (
	storedFields = []string{"block_hashes", "parent_block_hash", "token_ids",
		"block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func kindOf(tag string) EventKind {
	switch tag {
	case "BlockStored":
		return KindBlockStored
	case "BlockRemoved":
		return KindBlockRemoved
	case "AllBlocksCleared":
		return KindAllBlocksCleared
	}
	return KindUnknown
}

// field decodes one named event field; unknown names are skipped.
func (dc *Decoder) field(e *Event, name string, hs, ts *span) error {
	d := dc.d
	var err error
	switch name {
	case "block_hashes":
		n, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		hs.lo = len(dc.hashes)
		for i := 0; i < n; i++ {
			h, err := hash(d)
			if err != nil {
				return err
			}
			dc.hashes = append(dc.hashes, h)
		}
		hs.hi = len(dc.hashes)
	case "parent_block_hash":
		if isNil(d) {
			e.HasParent = false
			return d.DecodeNil()
		}
		e.Parent, err = hash(d)
		e.HasParent = err == nil
	case "token_ids":
		n, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		ts.lo = len(dc.tokens)
		for i := 0; i < n; i++ {
			t, err := d.DecodeInt64()
			if err != nil {
				return err
			}
			if t < 0 || t > math.MaxUint32 {
				return fmt.Errorf("token id %d out of range", t)
			}
			dc.tokens = append(dc.tokens, uint32(t))
		}
		ts.hi = len(dc.tokens)
	case "block_size":
		var n int64
		n, err = d.DecodeInt64()
		if err == nil && (n <= 0 || n > 1<<20) {
			err = fmt.Errorf("block size %d out of range", n)
		}
		e.BlockSize = int(n)
	case "lora_id":
		e.LoraID, e.HasLora, err = optInt(d)
	case "medium":
		if isNil(d) {
			return d.DecodeNil()
		}
		e.Medium, err = d.DecodeString()
	case "group_idx":
		e.GroupIdx, _, err = optInt(d)
	default:
		err = d.Skip()
	}
	return err
}

// hash decodes an engine block hash: an integer (signed or unsigned) or a
// byte string.
func hash(d *msgpack.Decoder) (uint64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if isBytes(c) {
		b, err := d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		return xxhash.Sum64(b), nil
	}
	if !isInt(c) {
		return 0, fmt.Errorf("block hash of msgpack code %#x", c)
	}
	return d.DecodeUint64()
}

func number(d *msgpack.Decoder) (float64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if isInt(c) {
		n, err := d.DecodeInt64()
		return float64(n), err
	}
	return d.DecodeFloat64()
}

func optInt(d *msgpack.Decoder) (int64, bool, error) {
	if isNil(d) {
		return 0, false, d.DecodeNil()
	}
	n, err := d.DecodeInt64()
	return n, err == nil, err
}

func skipN(d *msgpack.Decoder, n int) error {
	for i := 0; i < n; i++ {
		if err := d.Skip(); err != nil {
			return err
		}
	}
	return nil
}

func isNil(d *msgpack.Decoder) bool {
	c, err := d.PeekCode()
	return err == nil && c == msgpcode.Nil
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isBytes(c byte) bool {
	return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32 ||
		msgpcode.IsString(c)
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}
