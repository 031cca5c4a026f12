package enginesim

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

func TestKVFixtureScenario(t *testing.T) {
	b1, b2 := KVFixtureBatches(), KVFixtureBatches()
	if diff := cmp.Diff(b1, b2); diff != "" {
		t.Fatalf("scenario not deterministic:\n%s", diff)
	}
	kinds := map[engine.KVEventKind]int{}
	chained := false
	for _, b := range b1 {
		for _, ev := range b {
			kinds[ev.Kind]++
			if ev.Kind == engine.BlockStored && ev.HasParent {
				chained = true
			}
		}
	}
	if kinds[engine.BlockStored] < 3 || kinds[engine.BlockRemoved] == 0 || kinds[engine.AllBlocksCleared] != 1 || !chained {
		t.Errorf("scenario events %v (chained %v)", kinds, chained)
	}
}

func TestWriteKVFixtures(t *testing.T) {
	dir := t.TempDir()
	files, err := WriteKVFixtures(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 8 {
		t.Fatalf("%d files", len(files))
	}
	for _, variant := range []string{"array-uint", "map-uint", "array-int", "map-bytes"} {
		raw, err := os.ReadFile(filepath.Join(dir, variant, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			Encoding KVEncoding `json:"encoding"`
			Messages []struct {
				File   string `json:"file"`
				Seq    uint64 `json:"seq"`
				Events []struct {
					Type string `json:"type"`
				} `json:"events"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		for i, msg := range m.Messages {
			payload, err := os.ReadFile(filepath.Join(dir, variant, msg.File))
			if err != nil {
				t.Fatal(err)
			}
			d := decodeBatch(t, m.Encoding, payload)
			if msg.Seq != uint64(i) || d.rank != 1 || len(d.events) != len(msg.Events) {
				t.Fatalf("%s message %d: seq %d rank %d events %d/%d", variant, i, msg.Seq, d.rank, len(d.events), len(msg.Events))
			}
			for j, ev := range d.events {
				if ev["type"] != msg.Events[j].Type {
					t.Errorf("%s message %d event %d: %v vs %s", variant, i, j, ev["type"], msg.Events[j].Type)
				}
			}
		}
	}
	// Written files are the same bytes on every run.
	dir2 := t.TempDir()
	if _, err := WriteKVFixtures(dir2); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		rel, _ := filepath.Rel(dir, f)
		a, _ := os.ReadFile(f)
		b, _ := os.ReadFile(filepath.Join(dir2, rel))
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between runs", rel)
		}
	}
}
