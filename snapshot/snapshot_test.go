package snapshot

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/selection"
)

var testKey = []byte("0123456789abcdef-test-key")

func testSnapshot(now time.Time) *Snapshot {
	return &Snapshot{
		Shape:   ShapeOf(selection.Config{}),
		Written: now,
		Replicas: []Replica{
			{ID: ReplicaID(testKey, "127.0.0.1:1"), Blocks: []uint64{3, 2, 1}},
			{ID: ReplicaID(testKey, "127.0.0.1:2"), Blocks: []uint64{9}},
		},
	}
}

// reseal rewrites path's companion for its current bytes (a snapshot
// written under the key, with other content).
func reseal(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := json.Marshal(companion{Version: Version, Alg: alg, Size: len(b), MAC: hex.EncodeToString(mac(testKey, b))})
	if err := os.WriteFile(CompanionPath(path), c, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestWriteRead(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	want := testSnapshot(now.Add(-time.Minute))
	opts := ReadOptions{Key: testKey, Shape: want.Shape, MaxAge: time.Hour, Now: now}

	tests := []struct {
		name  string
		alter func(t *testing.T, path string)
		opts  func(o *ReadOptions)
		want  Reason // "" loaded
	}{
		{name: "verifies", alter: func(*testing.T, string) {}},
		{name: "missing", alter: func(t *testing.T, p string) { os.Remove(p); os.Remove(CompanionPath(p)) }, want: Missing},
		{name: "companion missing", alter: func(t *testing.T, p string) { os.Remove(CompanionPath(p)) }, want: Tampered},
		{name: "snapshot byte flipped", alter: func(t *testing.T, p string) {
			b, _ := os.ReadFile(p)
			b[len(b)-3] ^= 1
			os.WriteFile(p, b, 0o600)
		}, want: Tampered},
		{name: "companion altered", alter: func(t *testing.T, p string) {
			b, _ := os.ReadFile(CompanionPath(p))
			var c companion
			json.Unmarshal(b, &c)
			c.MAC = hex.EncodeToString(make([]byte, 32))
			b, _ = json.Marshal(c)
			os.WriteFile(CompanionPath(p), b, 0o600)
		}, want: Tampered},
		{name: "companion garbage", alter: func(t *testing.T, p string) { os.WriteFile(CompanionPath(p), []byte("{"), 0o600) }, want: Tampered},
		{name: "another key", alter: func(*testing.T, string) {}, opts: func(o *ReadOptions) { o.Key = []byte("another key of 16+ bytes") }, want: Tampered},
		{name: "block size changed", alter: func(*testing.T, string) {},
			opts: func(o *ReadOptions) { o.Shape = ShapeOf(selection.Config{BlockTokens: 32}) }, want: ShapeMismatch},
		{name: "hash scheme changed", alter: func(*testing.T, string) {},
			opts: func(o *ReadOptions) { o.Shape.Probe++ }, want: ShapeMismatch},
		{name: "format version", alter: func(t *testing.T, p string) {
			b, _ := os.ReadFile(p)
			binary.LittleEndian.PutUint32(b[8:], Version+1)
			reseal(t, p, b)
		}, want: ShapeMismatch},
		{name: "verified but malformed", alter: func(t *testing.T, p string) {
			b, _ := os.ReadFile(p)
			reseal(t, p, b[:len(b)-4])
		}, want: Unreadable},
		{name: "too old", alter: func(*testing.T, string) {}, opts: func(o *ReadOptions) { o.MaxAge = 30 * time.Second }, want: TooOld},
		{name: "too large", alter: func(*testing.T, string) {}, opts: func(o *ReadOptions) { o.MaxBytes = 32 }, want: TooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "index.snap")
			if _, err := Write(path, testKey, want); err != nil {
				t.Fatal(err)
			}
			tt.alter(t, path)
			o := opts
			if tt.opts != nil {
				tt.opts(&o)
			}
			got, err := Read(path, o)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want.Replicas, got.Replicas); diff != "" || !got.Written.Equal(want.Written) || got.Shape != want.Shape {
					t.Fatalf("read back (-want +got):\n%s", diff)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Reason != tt.want {
				t.Fatalf("Read error = %v, want reason %s", err, tt.want)
			}
		})
	}
}

func TestBeliefsDropsReplicasNotInPool(t *testing.T) {
	s := testSnapshot(time.Now())
	bs, dropped := s.Beliefs(testKey, []string{"127.0.0.1:2", "127.0.0.1:3"})
	want := []selection.Beliefs{{Key: "127.0.0.1:2", Blocks: []uint64{9}}}
	if diff := cmp.Diff(want, bs); diff != "" || dropped != 1 {
		t.Fatalf("beliefs (-want +got):\n%s\ndropped %d, want 1", diff, dropped)
	}
	// Another key names other replicas: none matches.
	if bs, dropped := s.Beliefs([]byte("another key of 16+ bytes"), []string{"127.0.0.1:1", "127.0.0.1:2"}); len(bs) != 0 || dropped != 2 {
		t.Fatalf("under another key: %d beliefs, %d dropped; want 0, 2", len(bs), dropped)
	}
}

func TestShapeOfFollowsTheFingerprint(t *testing.T) {
	a, b := ShapeOf(selection.Config{}), ShapeOf(selection.Config{})
	if a != b {
		t.Fatalf("ShapeOf is not deterministic: %v, %v", a, b)
	}
	c := ShapeOf(selection.Config{CharsPerToken: 3})
	if c.Probe == a.Probe || c == a {
		t.Fatalf("another chars_per_token gives the same probe: %v, %v", a, c)
	}
}

func TestDecodeBoundsCounts(t *testing.T) {
	b := Encode(testSnapshot(time.Now()))
	binary.LittleEndian.PutUint32(b[44:], 1<<30) // replica count
	if _, err := Decode(b); err == nil {
		t.Fatal("a replica count past the bytes present decodes")
	}
	b = Encode(testSnapshot(time.Now()))
	binary.LittleEndian.PutUint32(b[headerBytes+IDBytes:], 1<<30) // first replica's block count
	if _, err := Decode(b); err == nil {
		t.Fatal("a block count past the bytes present decodes")
	}
}

func TestWriteRefusesAShortKey(t *testing.T) {
	if _, err := Write(filepath.Join(t.TempDir(), "s"), []byte("short"), testSnapshot(time.Now())); err == nil {
		t.Fatal("Write with a 5-byte key: no error")
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(testSnapshot(time.Unix(0, 0))))
	f.Add(Encode(&Snapshot{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			return
		}
		// What decodes encodes back to the same bytes.
		if got := Encode(s); string(got) != string(b) {
			t.Fatalf("re-encoded %d bytes differ from the %d decoded", len(got), len(b))
		}
	})
}
