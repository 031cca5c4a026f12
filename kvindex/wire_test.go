package kvindex

import (
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// Test-side encoder of vLLM's KV-event wire format, written from the
// format's description (vllm/distributed/kv_events.py), independent of
// the decoder.

type encoding int

const (
	positional encoding = iota // msgspec array_like=True, tag first
	mapped                     // msgspec tagged structs as maps, "type" key
)

// wireEvent is one event to encode. Hashes are any of uint64, int64 or
// []byte; nil Parent/Lora/Medium encode as msgpack nil.
type wireEvent struct {
	Kind      EventKind
	Hashes    []any
	Parent    any
	Tokens    []uint32
	BlockSize int
	Lora      any
	Medium    any
	// Extra fields appended after the known ones (positional) or under
	// unknown keys (map), as newer engine versions add.
	Extra []any
}

func (e wireEvent) value(enc encoding) any {
	tokens := make([]int64, len(e.Tokens))
	for i, t := range e.Tokens {
		tokens[i] = int64(t)
	}
	hashes := e.Hashes
	if hashes == nil {
		hashes = []any{}
	}
	switch enc {
	case positional:
		switch e.Kind {
		case KindBlockStored:
			v := []any{"BlockStored", hashes, e.Parent, tokens, e.BlockSize, e.Lora, e.Medium}
			return append(v, e.Extra...)
		case KindBlockRemoved:
			return append([]any{"BlockRemoved", hashes, e.Medium}, e.Extra...)
		case KindAllBlocksCleared:
			return append([]any{"AllBlocksCleared"}, e.Extra...)
		}
		return append([]any{"SomethingNew"}, e.Extra...)
	default:
		var m map[string]any
		switch e.Kind {
		case KindBlockStored:
			m = map[string]any{"type": "BlockStored", "block_hashes": hashes,
				"parent_block_hash": e.Parent, "token_ids": tokens,
				"block_size": e.BlockSize, "lora_id": e.Lora, "medium": e.Medium}
		case KindBlockRemoved:
			m = map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": e.Medium}
		case KindAllBlocksCleared:
			m = map[string]any{"type": "AllBlocksCleared"}
		default:
			m = map[string]any{"type": "SomethingNew"}
		}
		for i, x := range e.Extra {
			m["extra_field_"+string(rune('a'+i))] = x
		}
		return m
	}
}

// encodeBatch encodes a batch; dpRank < 0 leaves the rank out.
func encodeBatch(enc encoding, ts float64, events []wireEvent, dpRank int) []byte {
	evs := make([]any, len(events))
	for i, e := range events {
		evs[i] = e.value(enc)
	}
	var v any
	if enc == positional {
		b := []any{ts, evs}
		if dpRank >= 0 {
			b = append(b, dpRank)
		}
		v = b
	} else {
		m := map[string]any{"ts": ts, "events": evs}
		if dpRank >= 0 {
			m["data_parallel_rank"] = dpRank
		}
		v = m
	}
	p, err := msgpack.Marshal(v)
	if err != nil {
		panic(err)
	}
	return p
}

func seqFrame(seq int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(seq))
	return b[:]
}

// stored is a BlockStored of uint64 hashes.
func stored(parent any, blockSize int, tokens []uint32, hashes ...uint64) wireEvent {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return wireEvent{Kind: KindBlockStored, Hashes: hs, Parent: parent, Tokens: tokens,
		BlockSize: blockSize, Medium: "GPU"}
}

func removed(hashes ...uint64) wireEvent {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	return wireEvent{Kind: KindBlockRemoved, Hashes: hs, Medium: "GPU"}
}

func cleared() wireEvent { return wireEvent{Kind: KindAllBlocksCleared} }

// seqTokens returns n token ids starting at from.
func seqTokens(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}
