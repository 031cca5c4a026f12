package enginesim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// KVMessage is one published KV event message: the three ZMQ frames
// (topic, 8-byte big-endian sequence number, msgpack payload).
type KVMessage struct {
	Topic   string
	Seq     uint64
	Payload []byte
	// Events are the engine events the payload encodes.
	Events []engine.KVEvent
}

// KVFixtureBatches runs a fixed, deterministic scenario on a small engine
// (no network, no clock) and returns its KV event batches, one per engine
// step that produced events:
//
//  1. a 5-block prompt prefilled in chunks of 4 blocks (two BlockStored,
//     the second chained to the first by parent_block_hash);
//  2. the next turn of that conversation (its new blocks chain to the
//     first turn's last block);
//  3. an unrelated long prompt that evicts older blocks (BlockRemoved);
//  4. a reset (AllBlocksCleared).
func KVFixtureBatches() [][]engine.KVEvent {
	e := engine.New(engine.Config{CapacityTokens: 24 * 16, MaxBatchedTokens: 64})
	var batches [][]engine.KVEvent
	var cur []engine.KVEvent
	e.SetKVEventHandler(func(ev engine.KVEvent) { cur = append(cur, ev) })
	flush := func() {
		if len(cur) > 0 {
			batches = append(batches, cur)
			cur = nil
		}
	}
	run := func(r engine.Request) {
		if err := e.Submit(r); err != nil {
			panic(fmt.Sprintf("fixture scenario: %v", err))
		}
		for i := 0; i < 10000; i++ {
			if _, ok := e.Step(nil); !ok {
				break
			}
			flush()
		}
	}
	turn1 := engine.SyntheticTokens(nil, 1, 5*16+3)
	run(engine.Request{ID: 1, Prompt: turn1, MaxTokens: 1})
	turn2 := engine.SyntheticTokens(append(append([]uint32(nil), turn1...), 7), 2, 3*16)
	run(engine.Request{ID: 2, Prompt: turn2, MaxTokens: 1})
	run(engine.Request{ID: 3, Prompt: engine.SyntheticTokens(nil, 3, 20*16), MaxTokens: 1})
	e.Reset()
	flush()
	return batches
}

// EncodeKVMessages encodes batches as consecutive messages from sequence
// 0, with timestamps ts0, ts0+1, ...
func EncodeKVMessages(batches [][]engine.KVEvent, enc KVEncoding, hashes HashEncoding, topic string, rank int, ts0 float64) ([]KVMessage, error) {
	out := make([]KVMessage, 0, len(batches))
	for i, b := range batches {
		p, err := EncodeKVBatch(enc, hashes, ts0+float64(i), b, rank)
		if err != nil {
			return nil, err
		}
		out = append(out, KVMessage{Topic: topic, Seq: uint64(i), Payload: p, Events: b})
	}
	return out, nil
}

// fixtureEvent is the JSON form of an engine event in a manifest.
type fixtureEvent struct {
	Type        string   `json:"type"`
	BlockHashes []uint64 `json:"block_hashes"`
	ParentHash  *uint64  `json:"parent_block_hash"`
	TokenIDs    []uint32 `json:"token_ids,omitempty"`
	BlockSize   int      `json:"block_size,omitempty"`
}

// WriteKVFixtures writes the fixture scenario's messages under dir, one
// subdirectory per encoding variant (array-uint, map-uint, array-int,
// map-bytes), each holding NNNN.msgpack payload files and a manifest.json
// that lists every message's topic, sequence, DP rank, timestamp and the
// events it encodes (hashes as unsigned integers). It returns the files
// written. Topic "kv@fixture", rank 1, timestamps from 1700000000.
func WriteKVFixtures(dir string) ([]string, error) {
	batches := KVFixtureBatches()
	variants := []struct {
		enc    KVEncoding
		hashes HashEncoding
	}{
		{KVEncodingArray, HashUint}, {KVEncodingMap, HashUint}, {KVEncodingArray, HashInt}, {KVEncodingMap, HashBytes},
	}
	const topic, rank, ts0 = "kv@fixture", 1, 1700000000.0
	var files []string
	for _, v := range variants {
		sub := filepath.Join(dir, string(v.enc)+"-"+string(v.hashes))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return files, fmt.Errorf("fixtures: %w", err)
		}
		msgs, err := EncodeKVMessages(batches, v.enc, v.hashes, topic, rank, ts0)
		if err != nil {
			return files, err
		}
		type entry struct {
			File   string         `json:"file"`
			Topic  string         `json:"topic"`
			Seq    uint64         `json:"seq"`
			Rank   int            `json:"data_parallel_rank"`
			TS     float64        `json:"ts"`
			Events []fixtureEvent `json:"events"`
		}
		manifest := struct {
			Encoding     KVEncoding   `json:"encoding"`
			HashEncoding HashEncoding `json:"hash_encoding"`
			Messages     []entry      `json:"messages"`
		}{Encoding: v.enc, HashEncoding: v.hashes}
		for _, m := range msgs {
			name := fmt.Sprintf("%04d.msgpack", m.Seq)
			path := filepath.Join(sub, name)
			if err := os.WriteFile(path, m.Payload, 0o644); err != nil {
				return files, fmt.Errorf("fixtures: %w", err)
			}
			files = append(files, path)
			en := entry{File: name, Topic: m.Topic, Seq: m.Seq, Rank: rank, TS: ts0 + float64(m.Seq)}
			for _, ev := range m.Events {
				fe := fixtureEvent{Type: ev.Kind.String(), BlockHashes: ev.BlockHashes, TokenIDs: ev.TokenIDs, BlockSize: ev.BlockSize}
				if ev.HasParent {
					p := ev.ParentHash
					fe.ParentHash = &p
				}
				en.Events = append(en.Events, fe)
			}
			manifest.Messages = append(manifest.Messages, en)
		}
		b, err := json.MarshalIndent(manifest, "", "  ")
		if err != nil {
			return files, fmt.Errorf("fixtures: %w", err)
		}
		path := filepath.Join(sub, "manifest.json")
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			return files, fmt.Errorf("fixtures: %w", err)
		}
		files = append(files, path)
	}
	return files, nil
}
