package kvindex

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// The fixtures in testdata/ are payloads captured from the engine
// simulator's publisher (bench/enginesim.EncodeKVBatch) in both encodings
// and all three hash encodings, with the engine model's events they carry
// in testdata/kv-events.json (written from the engine model, not from the
// decoder). Regenerate with: go test ./kvindex/ -run TestDecodeFixtures -update

var update = flag.Bool("update", false, "regenerate the testdata fixtures")

// goldenEvent is an engine event as the model emitted it.
type goldenEvent struct {
	Kind      string   `json:"kind"`
	Hashes    []uint64 `json:"hashes,omitempty"`
	Parent    *uint64  `json:"parent,omitempty"`
	Tokens    []uint32 `json:"tokens,omitempty"`
	BlockSize int      `json:"block_size,omitempty"`
}

var (
	fixtureEncodings = []enginesim.KVEncoding{enginesim.KVEncodingArray, enginesim.KVEncodingMap}
	fixtureHashes    = []enginesim.HashEncoding{enginesim.HashUint, enginesim.HashInt, enginesim.HashBytes}
)

func fixtureName(enc enginesim.KVEncoding, h enginesim.HashEncoding, batch int) string {
	return filepath.Join("testdata", fmt.Sprintf("kv-%s-%s-%d.msgpack", enc, h, batch))
}

// fixtureBatches runs the engine model through stores, evictions and a
// reset, and returns its events in three batches.
func fixtureBatches() [][]engine.KVEvent {
	e := engine.New(engine.Config{BlockSize: 4, CapacityTokens: 12 * 4, MaxModelLen: 1024})
	var evs []engine.KVEvent
	e.SetKVEventHandler(func(ev engine.KVEvent) { evs = append(evs, ev) })
	run := func(id uint64, prompt []uint32) {
		if err := e.Submit(engine.Request{ID: id, Prompt: prompt, MaxTokens: 2}); err != nil {
			panic(err)
		}
		for {
			t, ok := e.NextEventTime()
			if !ok {
				return
			}
			e.AdvanceTo(t, nil)
		}
	}
	var batches [][]engine.KVEvent
	cut := func() { batches = append(batches, evs); evs = nil }
	sys := seqTokens(100, 12)
	run(1, append(append([]uint32{}, sys...), seqTokens(500, 6)...))
	run(2, append(append([]uint32{}, sys...), seqTokens(600, 9)...))
	cut()
	run(3, seqTokens(0x10000, 30)) // evicts
	cut()
	e.Reset()
	run(4, seqTokens(7, 9))
	cut()
	return batches
}

func toGolden(b []engine.KVEvent) []goldenEvent {
	out := make([]goldenEvent, len(b))
	for i, ev := range b {
		g := goldenEvent{Kind: ev.Kind.String(), Hashes: ev.BlockHashes, Tokens: ev.TokenIDs, BlockSize: ev.BlockSize}
		if ev.HasParent {
			p := ev.ParentHash
			g.Parent = &p
		}
		out[i] = g
	}
	return out
}

func writeFixtures(t *testing.T) {
	batches := fixtureBatches()
	var golden [][]goldenEvent
	for i, b := range batches {
		golden = append(golden, toGolden(b))
		for _, enc := range fixtureEncodings {
			for _, h := range fixtureHashes {
				p, err := enginesim.EncodeKVBatch(enc, h, float64(1700000000+i), b, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(fixtureName(enc, h, i), p, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	j, err := json.MarshalIndent(golden, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", "kv-events.json"), append(j, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// expectedHash is how the decoder must carry an engine hash sent as h.
func expectedHash(h enginesim.HashEncoding, v uint64) uint64 {
	if h == enginesim.HashBytes {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], v)
		return xxhash.Sum64(b[:])
	}
	return v
}

func TestDecodeFixtures(t *testing.T) {
	if *update {
		writeFixtures(t)
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "kv-events.json"))
	if err != nil {
		t.Fatal(err)
	}
	var golden [][]goldenEvent
	if err := json.Unmarshal(raw, &golden); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, b := range golden {
		for _, g := range b {
			kinds[g.Kind]++
		}
	}
	if kinds["BlockStored"] == 0 || kinds["BlockRemoved"] == 0 || kinds["AllBlocksCleared"] == 0 {
		t.Fatalf("fixtures lack an event kind: %v", kinds)
	}
	for _, enc := range fixtureEncodings {
		for _, h := range fixtureHashes {
			t.Run(fmt.Sprintf("%s/%s", enc, h), func(t *testing.T) {
				dc := NewDecoder()
				x := New(Config{BlockSize: 4})
				r, _ := x.Register("sim#0")
				for i, gb := range golden {
					p, err := os.ReadFile(fixtureName(enc, h, i))
					if err != nil {
						t.Fatal(err)
					}
					if err := dc.DecodeBatch(p); err != nil {
						t.Fatalf("batch %d: %v", i, err)
					}
					b := dc.Batch()
					if b.TS != float64(1700000000+i) || !b.HasDPRank || b.DPRank != 0 {
						t.Errorf("batch %d: ts %v dp %v/%d", i, b.TS, b.HasDPRank, b.DPRank)
					}
					want := make([]Event, len(gb))
					for j, g := range gb {
						e := Event{Kind: kindOf(g.Kind), TokenIDs: g.Tokens, BlockSize: g.BlockSize}
						if e.Kind != KindAllBlocksCleared {
							e.Medium = "GPU"
						}
						for _, v := range g.Hashes {
							e.BlockHashes = append(e.BlockHashes, expectedHash(h, v))
						}
						if g.Parent != nil {
							e.Parent, e.HasParent = expectedHash(h, *g.Parent), true
						}
						want[j] = e
					}
					if diff := cmp.Diff(want, b.Events, cmpEvents); diff != "" {
						t.Fatalf("batch %d (-want +got):\n%s", i, diff)
					}
					x.Apply(r, b)
				}
				// Applied in order, the batches leave what the engine holds
				// after its reset: the last request's two full blocks.
				if x.Entries() != 2 || x.Orphans() != 0 || x.Fences(FenceCleared) != 1 {
					t.Errorf("entries %d orphans %d clears %d", x.Entries(), x.Orphans(), x.Fences(FenceCleared))
				}
				if got := overlaps(x, seqTokens(7, 9)); got[0] != 8 {
					t.Errorf("overlap %d, want 8", got[0])
				}
			})
		}
	}
}
