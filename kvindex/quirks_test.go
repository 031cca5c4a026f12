package kvindex

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

// The fixtures in testdata/quirks/ are written by hand from the publishers'
// formats (see testdata/quirks/README), one per quirk seen in the field.

// readFrames reads a hand-written fixture: messages separated by "=" lines,
// each a list of frames.
func readFrames(t *testing.T, name string) [][][]byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "quirks", name))
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][][]byte
	var cur [][]byte
	var frame strings.Builder
	open := false
	flush := func() {
		if !open {
			return
		}
		s := frame.String()
		if s == "-" {
			s = ""
		}
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cur = append(cur, b)
		frame.Reset()
		open = false
	}
	for _, line := range strings.Split(string(raw), "\n") {
		cont := len(line) > 0 && (line[0] == ' ' || line[0] == '\t')
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		text := strings.Join(strings.Fields(line), "")
		if text == "" {
			continue
		}
		if text == "=" {
			flush()
			msgs, cur = append(msgs, cur), nil
			continue
		}
		if !cont {
			flush()
			open = true
		}
		frame.WriteString(text)
	}
	flush()
	return append(msgs, cur)
}

// payloads reads a fixture of payloads (one message, one frame each).
func payloads(t *testing.T, name string) [][]byte {
	t.Helper()
	m := readFrames(t, name)
	if len(m) != 1 {
		t.Fatalf("%s: %d messages, want 1", name, len(m))
	}
	return m[0]
}

func decodeOne(t *testing.T, name string) *Batch {
	t.Helper()
	p := payloads(t, name)
	if len(p) != 1 {
		t.Fatalf("%s: %d payloads, want 1", name, len(p))
	}
	dc := NewDecoder()
	if err := dc.DecodeBatch(p[0]); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	b := dc.Batch()
	if len(b.Events) != 1 || b.Events[0].Kind != KindBlockStored {
		t.Fatalf("%s: events %+v, want one BlockStored", name, b.Events)
	}
	return b
}

// quirkIndex returns an index of block size 4 with one replica.
func quirkIndex(t *testing.T) (*Index, Replica) {
	t.Helper()
	x := New(Config{BlockSize: 4})
	r, err := x.Register("e")
	if err != nil {
		t.Fatal(err)
	}
	x.Fence(r, FenceReconnect) // not fresh until its first event
	return x, r
}

func overlapOf(x *Index, r Replica, tokens []uint32) int {
	out := make([]int, x.NumReplicas())
	x.Overlap(x.Keys(nil, 0, tokens), out)
	return out[r]
}

var tokens1to8 = []uint32{1, 2, 3, 4, 5, 6, 7, 8}

// Every chain-start variant and every field-count variant keys both blocks.
func TestQuirkChainStartsAndFieldCounts(t *testing.T) {
	for _, tc := range []struct {
		file      string
		hasParent bool
		rank      int64
		hasRank   bool
	}{
		{"parent-zero-array.hex", true, 0, true},
		{"parent-nil-array.hex", false, 0, true},
		{"parent-absent-map.hex", false, 1, true},
		{"trailing-omitted.hex", false, 0, false},
		{"trailing-added.hex", false, 2, true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b := decodeOne(t, tc.file)
			e := b.Events[0]
			if b.TS != 1.5 || b.DPRank != tc.rank || b.HasDPRank != tc.hasRank {
				t.Fatalf("batch ts %v rank %d/%v, want 1.5 %d/%v", b.TS, b.DPRank, b.HasDPRank, tc.rank, tc.hasRank)
			}
			if e.HasParent != tc.hasParent || e.Parent != 0 || e.BlockSize != 4 ||
				len(e.BlockHashes) != 2 || e.BlockHashes[0] != 10 || e.BlockHashes[1] != 11 ||
				len(e.TokenIDs) != 8 {
				t.Fatalf("event %+v", e)
			}
			x, r := quirkIndex(t)
			x.Apply(r, b)
			if got := overlapOf(x, r, tokens1to8); got != 8 {
				t.Fatalf("overlap %d, want 8 (orphans %d)", got, x.Orphans())
			}
			if x.Orphans() != 0 || x.Entries() != 2 {
				t.Fatalf("orphans %d entries %d, want 0 and 2", x.Orphans(), x.Entries())
			}
		})
	}
}

// A parent of 0 is a real parent when the replica holds a block hashing to
// 0: then the chain continues under it.
func TestQuirkParentZeroHeld(t *testing.T) {
	x, r := quirkIndex(t)
	x.Apply(r, &Batch{Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{0},
		TokenIDs: []uint32{9, 9, 9, 9}, BlockSize: 4}}})
	x.Apply(r, decodeOne(t, "parent-zero-array.hex"))
	if got := overlapOf(x, r, append([]uint32{9, 9, 9, 9}, tokens1to8...)); got != 12 {
		t.Fatalf("overlap %d, want 12: parent 0 must chain under the held block 0", got)
	}
	if got := overlapOf(x, r, tokens1to8); got != 0 {
		t.Fatalf("overlap %d of the unchained prompt, want 0", got)
	}
}

// Hashes as uint64, int64 and bytes.
func TestQuirkHashEncodings(t *testing.T) {
	u := decodeOne(t, "hash-uint64.hex").Events[0].BlockHashes
	want := []uint64{0xfffffffffffffffe, 0x8000000000000001}
	if len(u) != 2 || u[0] != want[0] || u[1] != want[1] {
		t.Fatalf("uint64 hashes %#x, want %#x", u, want)
	}
	i := decodeOne(t, "hash-int64.hex").Events[0].BlockHashes
	if len(i) != 2 || i[0] != want[0] || i[1] != want[1] {
		t.Fatalf("int64 hashes %#x, want %#x (their two's complement)", i, want)
	}
	var b0, b1 [32]byte
	for k := range b0 {
		b0[k], b1[k] = byte(k), byte(32+k)
	}
	bh := decodeOne(t, "hash-bytes.hex").Events[0].BlockHashes
	if len(bh) != 2 || bh[0] != xxhash.Sum64(b0[:]) || bh[1] != xxhash.Sum64(b1[:]) {
		t.Fatalf("bytes hashes %#x", bh)
	}
	for _, f := range []string{"hash-uint64.hex", "hash-int64.hex", "hash-bytes.hex"} {
		x, r := quirkIndex(t)
		x.Apply(r, decodeOne(t, f))
		if got := overlapOf(x, r, tokens1to8); got != 8 {
			t.Fatalf("%s: overlap %d, want 8", f, got)
		}
	}
}

// Replay replies with and without a topic frame, and their end markers.
func TestQuirkReplayFramings(t *testing.T) {
	for _, f := range []string{"replay-vllm.frames", "replay-topic.frames"} {
		t.Run(f, func(t *testing.T) {
			msgs := readFrames(t, f)
			if len(msgs) != 2 {
				t.Fatalf("%d messages, want 2", len(msgs))
			}
			seq, frames, end, err := SplitReplay(msgs[0])
			if err != nil || end || seq != 7 {
				t.Fatalf("reply: seq %d end %v err %v", seq, end, err)
			}
			m, err := NewDecoder().DecodeFrames(frames)
			if err != nil || m.Seq != 7 || len(m.Batch.Events) != 1 {
				t.Fatalf("decoded %+v, %v", m, err)
			}
			if seq, _, end, err := SplitReplay(msgs[1]); err != nil || !end || seq != ReplayEnd {
				t.Fatalf("end marker: seq %#x end %v err %v", seq, end, err)
			}
		})
	}
	if _, _, _, err := SplitReplay([][]byte{{}, {1, 2}}); err == nil {
		t.Fatal("a 1-frame reply was accepted")
	}
}

// A feed whose first message is sequence 1 is complete.
func TestQuirkSeqFromOne(t *testing.T) {
	msgs := readFrames(t, "seq-from-1.frames")
	x := New(Config{BlockSize: 4})
	s, err := NewSubscriber(x, []Endpoint{{Replica: "e", Events: "tcp://127.0.0.1:1"}}, SubscriberConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r := s.reps[0]
	f := &feed{dec: NewDecoder(), rdec: NewDecoder()}
	s.handle(context.Background(), s.eps[0], r, f, msgs[0])
	st := x.Stats(r)
	if !st.Complete || !st.Fresh || st.LastSeq != 1 || st.Entries != 2 {
		t.Fatalf("stats %+v, want complete, fresh, seq 1, 2 entries", st)
	}
	if !bytes.Equal(msgs[0][0], []byte("kv")) {
		t.Fatalf("topic %q", msgs[0][0])
	}
}

// A re-store of scattered evicted blocks is keyed by the blocks' known
// identities, not as a chain.
func TestQuirkNonContiguousStore(t *testing.T) {
	p := payloads(t, "noncontiguous.hex")
	if len(p) != 3 {
		t.Fatalf("%d payloads, want 3", len(p))
	}
	x, r := quirkIndex(t)
	dc := NewDecoder()
	for i, pl := range p {
		if err := dc.DecodeBatch(pl); err != nil {
			t.Fatalf("payload %d: %v", i, err)
		}
		x.Apply(r, dc.Batch())
	}
	all := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if got := overlapOf(x, r, all); got != 16 {
		t.Fatalf("overlap %d, want 16", got)
	}
	// The wrong chain (block 4's tokens right after block 2) is not held.
	if got := overlapOf(x, r, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 15, 16}); got != 8 {
		t.Fatalf("mis-keyed chain: overlap %d, want 8", got)
	}
	// A block of unknown identity in a store proven not a chain is skipped.
	x.Apply(r, &Batch{Events: []Event{{Kind: KindBlockRemoved, BlockHashes: []uint64{2}}}})
	x.Apply(r, &Batch{Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{2, 99, 4},
		Parent: 1, HasParent: true, BlockSize: 4,
		TokenIDs: []uint32{5, 6, 7, 8, 20, 21, 22, 23, 13, 14, 15, 16}}}})
	if x.NonChain() != 1 {
		t.Fatalf("non-chain blocks %d, want 1", x.NonChain())
	}
	if got := overlapOf(x, r, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23}); got != 8 {
		t.Fatalf("unprovable block keyed: overlap %d, want 8", got)
	}
	if got := overlapOf(x, r, all); got != 16 {
		t.Fatalf("overlap %d after the re-store, want 16", got)
	}
}

// A feed whose stores are all orphans is reported unhealthy and not fresh
// (its replica falls back to the estimate), and recovers when a store lands.
func TestOrphanFeedUnhealthy(t *testing.T) {
	x := New(Config{BlockSize: 4, MaxOrphanRun: 3})
	r, err := x.Register("e")
	if err != nil {
		t.Fatal(err)
	}
	orphan := Batch{Events: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{7}, Parent: 12345,
		HasParent: true, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4}}}
	for i := 0; i < 2; i++ {
		x.Apply(r, &orphan)
	}
	if ch, _ := x.HealthChange(r); ch || !x.Fresh(r) {
		t.Fatalf("unhealthy after 2 orphans of 3 allowed (changed %v, fresh %v)", ch, x.Fresh(r))
	}
	x.Apply(r, &orphan)
	ch, reason := x.HealthChange(r)
	if !ch || reason == "" || x.Fresh(r) || x.Stats(r).Healthy {
		t.Fatalf("after 3 orphans: changed %v reason %q fresh %v", ch, reason, x.Fresh(r))
	}
	x.Apply(r, &orphan)
	if ch, _ := x.HealthChange(r); ch || x.Fresh(r) {
		t.Fatal("a second transition reported, or fresh again on an orphan")
	}
	cands := make([]selection.Candidate, 1)
	x.Annotate(x.Keys(nil, 0, []uint32{1, 2, 3, 4}), []Replica{r}, cands, make([]int, 1))
	if cands[0].Precise {
		t.Fatal("an unhealthy feed annotated precise")
	}
	x.Apply(r, decodeOne(t, "parent-nil-array.hex"))
	if ch, reason := x.HealthChange(r); !ch || reason != "" || !x.Fresh(r) {
		t.Fatalf("after a landed store: changed %v reason %q fresh %v", ch, reason, x.Fresh(r))
	}
	// Stores failing for the stall window make the feed unhealthy too.
	now := time.Unix(1000, 0)
	y := New(Config{BlockSize: 4, StallWindow: time.Second, Now: func() time.Time { return now }})
	q, _ := y.Register("e")
	y.Apply(q, &orphan)
	now = now.Add(2 * time.Second)
	y.Apply(q, &orphan)
	if ch, reason := y.HealthChange(q); !ch || !strings.Contains(reason, "no store landed") {
		t.Fatalf("stalled feed: changed %v reason %q", ch, reason)
	}
}
