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
	c, _ := json.Marshal(companion{Version: Version, Alg: alg, WriteID: hex.EncodeToString(b[12 : 12+WriteIDBytes]),
		Size: len(b), MAC: hex.EncodeToString(mac(testKey, b))})
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
		{name: "companion missing", alter: func(t *testing.T, p string) { os.Remove(CompanionPath(p)) }, want: Incomplete},
		{name: "companion of another write", alter: func(t *testing.T, p string) {
			c, _ := os.ReadFile(CompanionPath(p))
			if _, err := Write(p, testKey, testSnapshot(now)); err != nil {
				t.Fatal(err)
			}
			os.WriteFile(CompanionPath(p), c, 0o600)
		}, want: Incomplete},
		{name: "write id altered", alter: func(t *testing.T, p string) {
			b, _ := os.ReadFile(p)
			b[12] ^= 1
			os.WriteFile(p, b, 0o600)
		}, want: Incomplete},
		{name: "header altered", alter: func(t *testing.T, p string) {
			b, _ := os.ReadFile(p)
			b[12+WriteIDBytes] ^= 1 // block_tokens
			os.WriteFile(p, b, 0o600)
		}, want: Tampered},
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
	binary.LittleEndian.PutUint32(b[headerBytes-4:], 1<<30) // replica count
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

// TestWriteCrashAtEveryStep interrupts a write of the pair at each of its
// steps (the snapshot's write, fsync, rename and directory fsync, then the
// companion's), over a verified pair of an earlier write and over none,
// and reads what a restart finds: the earlier snapshot, the new one, or a
// refusal that says the pair is incomplete. It never loads a pair that
// does not belong together, and never calls an interrupted write
// tampered.
func TestWriteCrashAtEveryStep(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	old, cur := testSnapshot(now.Add(-time.Minute)), testSnapshot(now)
	cur.Replicas[0].Blocks = []uint64{7, 8, 9, 10}
	opts := ReadOptions{Key: testKey, Shape: old.Shape, Now: now}
	crash := errors.New("simulated crash")
	const steps = 8
	for _, prior := range []bool{true, false} {
		for at := range steps + 1 { // steps: no crash
			path := filepath.Join(t.TempDir(), "index.snap")
			if prior {
				if _, err := Write(path, testKey, old); err != nil {
					t.Fatal(err)
				}
			}
			_, err := write(path, testKey, cur, func(st int) error {
				if st == at {
					return crash
				}
				return nil
			})
			if at < steps && !errors.Is(err, crash) {
				t.Fatalf("prior %t, crash at step %d: write = %v, want the crash", prior, at, err)
			}
			got, err := Read(path, opts)
			// The snapshot is in place from its rename on (step 2 done, at
			// >= 3), the companion from its rename on (at >= 7).
			var want *Snapshot
			var reason Reason
			switch {
			case at >= 7:
				want = cur
			case at >= 3:
				reason = Incomplete
			case prior:
				want = old
			default:
				reason = Missing
			}
			if want != nil {
				if err != nil {
					t.Fatalf("prior %t, crash at step %d: %v, want the %s snapshot", prior, at, err, map[bool]string{true: "new", false: "earlier"}[want == cur])
				}
				if diff := cmp.Diff(want.Replicas, got.Replicas); diff != "" || !got.Written.Equal(want.Written) {
					t.Fatalf("prior %t, crash at step %d: loaded (-want +got):\n%s", prior, at, diff)
				}
				continue
			}
			var e *Error
			if !errors.As(err, &e) || e.Reason != reason {
				t.Fatalf("prior %t, crash at step %d: Read = %v, want reason %s", prior, at, err, reason)
			}
		}
	}
}
