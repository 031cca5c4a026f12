package kvindex

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

// The fixtures in testdata/enginesim/ are messages captured from the engine
// simulator's publisher (bench/enginesim.WriteKVFixtures): one directory per
// variant (array-uint, map-uint, array-int, map-bytes) holding the msgpack
// payloads and a manifest.json with each message's sequence, topic, rank,
// timestamp and the engine events it carries, written from the engine
// model, not from this decoder. Regenerate with:
//
//	go test ./kvindex/ -run TestDecodeFixtures -update

var update = flag.Bool("update", false, "regenerate the testdata fixtures")

var fixtureDir = filepath.Join("testdata", "enginesim")

type fixtureManifest struct {
	Encoding     string `json:"encoding"`
	HashEncoding string `json:"hash_encoding"`
	Messages     []struct {
		File   string  `json:"file"`
		Topic  string  `json:"topic"`
		Seq    uint64  `json:"seq"`
		Rank   int64   `json:"data_parallel_rank"`
		TS     float64 `json:"ts"`
		Events []struct {
			Type        string   `json:"type"`
			BlockHashes []uint64 `json:"block_hashes"`
			ParentHash  *uint64  `json:"parent_block_hash"`
			TokenIDs    []uint32 `json:"token_ids"`
			BlockSize   int      `json:"block_size"`
		} `json:"events"`
	} `json:"messages"`
}

// expectedHash is how the decoder must carry an engine hash sent as enc.
func expectedHash(enc string, v uint64) uint64 {
	if enc == "bytes" {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], v)
		return xxhash.Sum64(b[:])
	}
	return v
}

func fixtureVariants(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(fixtureDir, "*-*"))
	if err != nil || len(dirs) < 4 {
		t.Fatalf("fixture variants %v: %v (regenerate with -update)", dirs, err)
	}
	return dirs
}

func TestDecodeFixtures(t *testing.T) {
	if *update {
		if err := os.RemoveAll(fixtureDir); err != nil {
			t.Fatal(err)
		}
		if _, err := enginesim.WriteKVFixtures(fixtureDir); err != nil {
			t.Fatal(err)
		}
	}
	encodings, hashKinds := map[string]bool{}, map[string]bool{}
	for _, dir := range fixtureVariants(t) {
		raw, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		var man fixtureManifest
		if err := json.Unmarshal(raw, &man); err != nil {
			t.Fatal(err)
		}
		encodings[man.Encoding], hashKinds[man.HashEncoding] = true, true
		t.Run(filepath.Base(dir), func(t *testing.T) {
			dc := NewDecoder()
			x := New(Config{BlockSize: 16})
			r, _ := x.Register("sim#1")
			kinds := map[EventKind]int{}
			held := map[uint64]bool{}
			for _, msg := range man.Messages {
				p, err := os.ReadFile(filepath.Join(dir, msg.File))
				if err != nil {
					t.Fatal(err)
				}
				m, err := dc.DecodeFrames([][]byte{[]byte(msg.Topic), seqFrame(int64(msg.Seq)), p})
				if err != nil {
					t.Fatalf("%s: %v", msg.File, err)
				}
				b := &m.Batch
				if m.Seq != msg.Seq || string(m.Topic) != msg.Topic || b.TS != msg.TS ||
					!b.HasDPRank || b.DPRank != msg.Rank {
					t.Errorf("%s: seq %d topic %q ts %v dp %v/%d", msg.File, m.Seq, m.Topic, b.TS, b.HasDPRank, b.DPRank)
				}
				want := make([]Event, len(msg.Events))
				for j, g := range msg.Events {
					e := Event{Kind: kindOf(g.Type), TokenIDs: g.TokenIDs, BlockSize: g.BlockSize}
					if e.Kind != KindAllBlocksCleared {
						e.Medium = "GPU"
					}
					for _, v := range g.BlockHashes {
						e.BlockHashes = append(e.BlockHashes, expectedHash(man.HashEncoding, v))
					}
					if g.ParentHash != nil {
						e.Parent, e.HasParent = expectedHash(man.HashEncoding, *g.ParentHash), true
					}
					want[j] = e
					kinds[e.Kind]++
				}
				if diff := cmp.Diff(want, b.Events, cmpEvents); diff != "" {
					t.Fatalf("%s (-want +got):\n%s", msg.File, diff)
				}
				// The index holds exactly the blocks the engine does.
				x.Apply(r, b)
				for _, g := range msg.Events {
					switch g.Type {
					case "BlockStored":
						for _, h := range g.BlockHashes {
							held[h] = true
						}
					case "BlockRemoved":
						for _, h := range g.BlockHashes {
							delete(held, h)
						}
					case "AllBlocksCleared":
						clear(held)
					}
				}
				if x.Orphans() != 0 || int(x.Entries()) != len(held) {
					t.Fatalf("%s: %d orphans, %d entries, engine holds %d blocks",
						msg.File, x.Orphans(), x.Entries(), len(held))
				}
			}
			if kinds[KindBlockStored] < 2 || kinds[KindBlockRemoved] == 0 || kinds[KindAllBlocksCleared] != 1 {
				t.Errorf("fixtures lack an event kind: %v", kinds)
			}
			if x.Fences(FenceCleared) != 1 || x.Entries() != 0 {
				t.Errorf("after the reset: clears %d entries %d", x.Fences(FenceCleared), x.Entries())
			}
		})
	}
	for _, want := range []string{"array", "map"} {
		if !encodings[want] {
			t.Errorf("no %s-encoded fixtures", want)
		}
	}
	for _, want := range []string{"uint", "int", "bytes"} {
		if !hashKinds[want] {
			t.Errorf("no fixtures with %s hashes", want)
		}
	}
}
