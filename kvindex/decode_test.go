package kvindex

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

func TestDecodeBatch(t *testing.T) {
	sha := []byte("0123456789abcdef0123456789abcdef")
	negative := int64(-42)
	tests := []struct {
		name   string
		events []wireEvent
		dp     int
		want   []Event
		wantDP bool
	}{
		{
			name:   "stored uint64 hashes with dp rank",
			events: []wireEvent{stored(nil, 2, seqTokens(1, 4), 11, math.MaxUint64)},
			dp:     3,
			wantDP: true,
			want: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{11, math.MaxUint64},
				TokenIDs: seqTokens(1, 4), BlockSize: 2, Medium: "GPU"}},
		},
		{
			name: "stored with parent, lora and negative int64 hash, no dp rank",
			events: []wireEvent{{Kind: KindBlockStored, Hashes: []any{negative}, Parent: uint64(7),
				Tokens: seqTokens(5, 2), BlockSize: 2, Lora: 3}},
			dp: -1,
			want: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{uint64(negative)},
				Parent: 7, HasParent: true, TokenIDs: seqTokens(5, 2), BlockSize: 2,
				LoraID: 3, HasLora: true}},
		},
		{
			name: "bytes hashes (sha256) and bytes parent",
			events: []wireEvent{{Kind: KindBlockStored, Hashes: []any{sha}, Parent: sha[:16],
				Tokens: seqTokens(0, 4), BlockSize: 4, Medium: "GPU"}},
			dp: 0, wantDP: true,
			want: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{xxhash.Sum64(sha)},
				Parent: xxhash.Sum64(sha[:16]), HasParent: true, TokenIDs: seqTokens(0, 4),
				BlockSize: 4, Medium: "GPU"}},
		},
		{
			name: "removed, cleared and an unknown event, with trailing fields",
			events: []wireEvent{
				{Kind: KindBlockRemoved, Hashes: []any{uint64(1), int64(2)}, Medium: "CPU",
					Extra: []any{0, "future"}},
				{Kind: KindAllBlocksCleared, Extra: []any{[]any{1, 2}}},
				{Kind: KindUnknown, Extra: []any{1}},
			},
			dp: 1, wantDP: true,
			want: []Event{
				{Kind: KindBlockRemoved, BlockHashes: []uint64{1, 2}, Medium: "CPU"},
				{Kind: KindAllBlocksCleared},
				{Kind: KindUnknown},
			},
		},
		{
			name: "stored with trailing fields (lora_name, extra_keys, group_idx, more)",
			events: []wireEvent{{Kind: KindBlockStored, Hashes: []any{uint64(9)}, Tokens: seqTokens(0, 2),
				BlockSize: 2, Medium: "GPU",
				Extra: []any{"adapter", []any{nil}, 0, "kv_cache_spec_kind", 4096, map[string]any{"x": 1}}}},
			dp: 0, wantDP: true,
			want: []Event{{Kind: KindBlockStored, BlockHashes: []uint64{9}, TokenIDs: seqTokens(0, 2),
				BlockSize: 2, Medium: "GPU"}},
		},
	}
	for _, enc := range []encoding{positional, mapped} {
		for _, tt := range tests {
			t.Run(encName(enc)+"/"+tt.name, func(t *testing.T) {
				dc := NewDecoder()
				payload := encodeBatch(enc, 1.5, tt.events, tt.dp)
				m, err := dc.DecodeFrames([][]byte{[]byte("kv-events"), seqFrame(77), payload})
				if err != nil {
					t.Fatal(err)
				}
				if m.Seq != 77 || string(m.Topic) != "kv-events" || m.Batch.TS != 1.5 {
					t.Errorf("seq %d topic %q ts %v", m.Seq, m.Topic, m.Batch.TS)
				}
				if m.Batch.HasDPRank != tt.wantDP || (tt.wantDP && m.Batch.DPRank != int64(tt.dp)) {
					t.Errorf("dp rank %v %d, want %v %d", m.Batch.HasDPRank, m.Batch.DPRank, tt.wantDP, tt.dp)
				}
				if diff := cmp.Diff(tt.want, m.Batch.Events, cmpEvents); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// cmpEvents treats nil and empty slices alike.
var cmpEvents = cmp.Transformer("events", func(e Event) Event {
	if len(e.BlockHashes) == 0 {
		e.BlockHashes = nil
	}
	if len(e.TokenIDs) == 0 {
		e.TokenIDs = nil
	}
	return e
})

func encName(e encoding) string {
	if e == positional {
		return "positional"
	}
	return "map"
}

func TestDecodeReusesBuffers(t *testing.T) {
	dc := NewDecoder()
	p1 := encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 4), 1, 2)}, 0)
	p2 := encodeBatch(mapped, 2, []wireEvent{removed(5), stored(uint64(5), 2, seqTokens(9, 2), 6)}, 0)
	if err := dc.DecodeBatch(p1); err != nil {
		t.Fatal(err)
	}
	if err := dc.DecodeBatch(p2); err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{Kind: KindBlockRemoved, BlockHashes: []uint64{5}, Medium: "GPU"},
		{Kind: KindBlockStored, BlockHashes: []uint64{6}, Parent: 5, HasParent: true,
			TokenIDs: seqTokens(9, 2), BlockSize: 2, Medium: "GPU"},
	}
	if diff := cmp.Diff(want, dc.Batch().Events, cmpEvents); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := dc.DecodeBatch(p1); err != nil {
			t.Fatal(err)
		}
	})
	// Strings (tags, "GPU") are the only allocations left.
	if allocs > 4 {
		t.Errorf("DecodeBatch allocates %v times per call, want <= 4", allocs)
	}
}

func TestDecodeErrors(t *testing.T) {
	good := encodeBatch(positional, 1, []wireEvent{stored(nil, 2, seqTokens(0, 2), 1)}, 0)
	mustMarshal := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name   string
		frames [][]byte
	}{
		{"one frame", [][]byte{good}},
		{"four frames", [][]byte{nil, seqFrame(1), good, nil}},
		{"short seq", [][]byte{nil, []byte{1, 2}, good}},
		{"empty payload", [][]byte{nil, seqFrame(1), nil}},
		{"truncated", [][]byte{nil, seqFrame(1), good[:len(good)-2]}},
		{"trailing bytes", [][]byte{nil, seqFrame(1), append(append([]byte{}, good...), 0xc0)}},
		{"batch is a string", [][]byte{nil, seqFrame(1), mustMarshal("hello")}},
		{"batch of one field", [][]byte{nil, seqFrame(1), mustMarshal([]any{1.0})}},
		{"events nil", [][]byte{nil, seqFrame(1), mustMarshal([]any{1.0, nil})}},
		{"map without events", [][]byte{nil, seqFrame(1), mustMarshal(map[string]any{"ts": 1.0})}},
		{"event tag not a string", [][]byte{nil, seqFrame(1), mustMarshal([]any{1.0, []any{[]any{7}}})}},
		{"hash is a float", [][]byte{nil, seqFrame(1), mustMarshal([]any{1.0,
			[]any{[]any{"BlockRemoved", []any{1.5}, nil}}})}},
		{"negative token", [][]byte{nil, seqFrame(1), mustMarshal([]any{1.0,
			[]any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1, nil, nil}}})}},
		{"zero block size", [][]byte{nil, seqFrame(1), mustMarshal([]any{1.0,
			[]any{[]any{"BlockStored", []any{1}, nil, []any{1}, 0, nil, nil}}})}},
	}
	dc := NewDecoder()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := dc.DecodeFrames(tt.frames)
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("err = %v, want ErrDecode", err)
			}
		})
	}
	// The decoder is still usable after errors.
	if _, err := dc.DecodeFrames([][]byte{nil, seqFrame(2), good}); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	seeds := [][]wireEvent{
		{stored(nil, 2, seqTokens(0, 4), 1, 2)},
		{stored(uint64(2), 2, seqTokens(4, 2), 3), removed(1, 2), cleared()},
		{{Kind: KindBlockStored, Hashes: []any{[]byte("abcdefgh")}, Parent: int64(-5),
			Tokens: seqTokens(1, 1), BlockSize: 1, Lora: 2, Extra: []any{"x", nil, 1}}},
		{{Kind: KindUnknown, Extra: []any{1, "a"}}},
	}
	for _, s := range seeds {
		for _, enc := range []encoding{positional, mapped} {
			f.Add(encodeBatch(enc, 1, s, 0))
			f.Add(encodeBatch(enc, 2, s, -1))
		}
	}
	// The simulator's captured payloads (testdata/enginesim/*/*.msgpack).
	fixtures, _ := filepath.Glob(filepath.Join("testdata", "enginesim", "*", "*.msgpack"))
	for _, name := range fixtures {
		if p, err := os.ReadFile(name); err == nil {
			f.Add(p)
		}
	}
	dc := NewDecoder()
	f.Fuzz(func(t *testing.T, payload []byte) {
		err := dc.DecodeBatch(payload)
		if err != nil {
			if !errors.Is(err, ErrDecode) {
				t.Fatalf("error not wrapping ErrDecode: %v", err)
			}
			return
		}
		// Whatever decodes must apply to an index without panicking, and
		// keep it within its budget.
		x := New(Config{MaxEntries: 64, BlockSize: 2})
		r, _ := x.Register("fuzz")
		x.Apply(r, dc.Batch())
		if x.Entries() > 64 {
			t.Fatalf("%d entries past a budget of 64", x.Entries())
		}
	})
}

func BenchmarkDecodeBatch(b *testing.B) {
	// A typical step: 32 blocks of 16 tokens stored, 8 removed.
	hs := make([]uint64, 32)
	for i := range hs {
		hs[i] = uint64(i) * 0x9E3779B97F4A7C15
	}
	events := []wireEvent{stored(uint64(7), 16, seqTokens(0, 32*16), hs...), removed(hs[:8]...)}
	for _, enc := range []encoding{positional, mapped} {
		payload := encodeBatch(enc, 1, events, 0)
		b.Run(encName(enc), func(b *testing.B) {
			dc := NewDecoder()
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if err := dc.DecodeBatch(payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
