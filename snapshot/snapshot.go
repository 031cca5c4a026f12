package snapshot

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/integrity"
	"github.com/ramjet-llm/ramjet/selection"
)

// Version is the snapshot format version (2: the header and the
// companion carry the write id).
const Version = 2

// MinKeyBytes is the shortest key accepted.
const MinKeyBytes = 16

// DefaultMaxBytes is the default bound on a snapshot file's size.
const DefaultMaxBytes = 64 << 20

// maxCompanionBytes bounds the companion file read.
const maxCompanionBytes = 4 << 10

// IDBytes is the length of a replica id.
const IDBytes = 16

var magic = [8]byte{'R', 'J', 'S', 'N', 'A', 'P', 0, '\n'}

// WriteIDBytes is the length of a write id.
const WriteIDBytes = 16

// headerBytes: magic, version, write id, block_tokens, prefix_tokens,
// chars_per_token, probe, written, replica count.
const headerBytes = 8 + 4 + WriteIDBytes + 4 + 4 + 8 + 8 + 8 + 4

// Shape is what a snapshot's block hashes depend on. Two configurations
// of one shape fingerprint every request alike.
type Shape struct {
	BlockTokens   int
	PrefixTokens  int
	CharsPerToken float64
	// Probe is the fingerprint of a fixed request: it changes when the
	// hash scheme or its seeding changes, whatever the settings.
	Probe uint64
}

// ShapeOf is the shape of cfg (defaults are filled in).
func ShapeOf(cfg selection.Config) Shape {
	cfg.SetDefaults()
	x := selection.NewExtractor(cfg)
	f := x.NewFeatures()
	n := int(float64(cfg.BlockTokens)*cfg.CharsPerToken)*4 + 64
	text := strings.Repeat("ramjet snapshot probe ", n/22+1)
	body := `{"model":"ramjet-probe","cache_salt":"probe","messages":[{"role":"system","content":"` + text[:n] + `"}]}`
	if err := x.Parse(selection.EndpointChat, []byte(body), f); err != nil {
		panic(fmt.Sprintf("snapshot probe does not parse: %v", err)) // a fixed valid body
	}
	h := f.Seed
	for _, b := range f.Blocks {
		h = h*0x100000001B3 ^ b
	}
	return Shape{BlockTokens: cfg.BlockTokens, PrefixTokens: cfg.PrefixTokens, CharsPerToken: cfg.CharsPerToken, Probe: h}
}

func (s Shape) String() string {
	return fmt.Sprintf("block_tokens %d, prefix_tokens %d, chars_per_token %g, probe %016x",
		s.BlockTokens, s.PrefixTokens, s.CharsPerToken, s.Probe)
}

// Replica is one replica's beliefs in a snapshot.
type Replica struct {
	ID     [IDBytes]byte // ReplicaID of its replica key
	Blocks []uint64      // least recently routed first
}

// Snapshot is the approximate index at one time.
type Snapshot struct {
	Shape   Shape
	Written time.Time
	// WriteID names one write of the pair: the snapshot's header and its
	// companion both carry it, so that a snapshot and a companion of
	// two different writes are told apart from an altered pair. Write
	// draws it.
	WriteID  [WriteIDBytes]byte
	Replicas []Replica
}

// Blocks is the number of (block, replica) beliefs in s.
func (s *Snapshot) Blocks() int {
	n := 0
	for _, r := range s.Replicas {
		n += len(r.Blocks)
	}
	return n
}

// ReplicaID names the replica key in a snapshot: a keyed hash, so that the
// file holds no address and ids stay stable while the key does.
func ReplicaID(key []byte, replicaKey string) [IDBytes]byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ramjet-snapshot/replica\x00"))
	m.Write([]byte(replicaKey))
	var id [IDBytes]byte
	copy(id[:], m.Sum(nil))
	return id
}

// FromBeliefs names the beliefs' replicas by ReplicaID.
func FromBeliefs(key []byte, bs []selection.Beliefs) []Replica {
	out := make([]Replica, len(bs))
	for i, b := range bs {
		out[i] = Replica{ID: ReplicaID(key, b.Key), Blocks: b.Blocks}
	}
	return out
}

// Beliefs maps the snapshot's replicas to the replica keys of pool, the
// replicas there now; the snapshot's replicas that are not in pool are
// dropped (their count is returned).
func (s *Snapshot) Beliefs(key []byte, pool []string) (bs []selection.Beliefs, dropped int) {
	byID := make(map[[IDBytes]byte]string, len(pool))
	for _, k := range pool {
		byID[ReplicaID(key, k)] = k
	}
	for _, r := range s.Replicas {
		k, ok := byID[r.ID]
		if !ok {
			dropped++
			continue
		}
		bs = append(bs, selection.Beliefs{Key: k, Blocks: r.Blocks})
	}
	return bs, dropped
}

// Encode returns the snapshot file's bytes.
func Encode(s *Snapshot) []byte {
	b := make([]byte, 0, headerBytes+len(s.Replicas)*(IDBytes+4)+8*s.Blocks())
	b = append(b, magic[:]...)
	b = binary.LittleEndian.AppendUint32(b, Version)
	b = append(b, s.WriteID[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(s.Shape.BlockTokens))
	b = binary.LittleEndian.AppendUint32(b, uint32(s.Shape.PrefixTokens))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(s.Shape.CharsPerToken))
	b = binary.LittleEndian.AppendUint64(b, s.Shape.Probe)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.Written.UnixNano()))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.Replicas)))
	for _, r := range s.Replicas {
		b = append(b, r.ID[:]...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Blocks)))
		for _, k := range r.Blocks {
			b = binary.LittleEndian.AppendUint64(b, k)
		}
	}
	return b
}

// errVersion is Decode's error for another format version.
var errVersion = errors.New("another format version")

// Decode parses a snapshot file. Counts are checked against the bytes
// present, so a malformed file allocates no more than its size.
func Decode(b []byte) (*Snapshot, error) {
	if len(b) < headerBytes || !bytes.Equal(b[:8], magic[:]) {
		return nil, errors.New("not a ramjet snapshot")
	}
	le := binary.LittleEndian
	if v := le.Uint32(b[8:]); v != Version {
		return nil, fmt.Errorf("format version %d, want %d: %w", v, Version, errVersion)
	}
	const o = 12 + WriteIDBytes
	s := &Snapshot{Shape: Shape{
		BlockTokens:   int(le.Uint32(b[o:])),
		PrefixTokens:  int(le.Uint32(b[o+4:])),
		CharsPerToken: math.Float64frombits(le.Uint64(b[o+8:])),
		Probe:         le.Uint64(b[o+16:]),
	}, Written: time.Unix(0, int64(le.Uint64(b[o+24:])))}
	copy(s.WriteID[:], b[12:])
	n := int(le.Uint32(b[o+32:]))
	b = b[headerBytes:]
	if n > len(b)/(IDBytes+4) {
		return nil, fmt.Errorf("%d replicas in %d bytes", n, len(b))
	}
	s.Replicas = make([]Replica, n)
	for i := range s.Replicas {
		if len(b) < IDBytes+4 {
			return nil, errors.New("truncated replica")
		}
		r := &s.Replicas[i]
		copy(r.ID[:], b)
		k := int(le.Uint32(b[IDBytes:]))
		b = b[IDBytes+4:]
		if k > len(b)/8 {
			return nil, fmt.Errorf("replica %d: %d blocks in %d bytes", i, k, len(b))
		}
		r.Blocks = make([]uint64, k)
		for j := range r.Blocks {
			r.Blocks[j] = le.Uint64(b[8*j:])
		}
		b = b[8*k:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(b))
	}
	return s, nil
}

// companion is the companion file: the write it vouches for (the
// snapshot's write id and size) and the HMAC over the snapshot.
type companion struct {
	Version int    `json:"version"`
	Alg     string `json:"alg"`
	WriteID string `json:"write_id"`
	Size    int    `json:"size"`
	MAC     string `json:"mac"`
}

const alg = "HMAC-SHA256"

func mac(key, b []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("ramjet-snapshot/v1\x00"))
	m.Write(b)
	return m.Sum(nil)
}

// CompanionPath is the companion file of the snapshot at path.
func CompanionPath(path string) string { return path + ".hmac" }

// Write writes s to path and its companion under key, each atomically
// (integrity.WriteFile): the snapshot first, then the companion, both
// naming a fresh write id. A crash between the two leaves the new
// snapshot beside the previous write's companion (or none): Read refuses
// the pair as Incomplete and ramjet starts cold. It returns the
// snapshot's size in bytes.
func Write(path string, key []byte, s *Snapshot) (int, error) {
	return write(path, key, s, nil)
}

// write is Write with a crash hook (tests; nil: none) run before each of
// the pair's steps: the snapshot's write, fsync, rename and directory
// fsync (0-3), then the companion's (4-7); an error stops it there.
func write(path string, key []byte, s *Snapshot, hook func(step int) error) (int, error) {
	if len(key) < MinKeyBytes {
		return 0, fmt.Errorf("snapshot key must be at least %d bytes", MinKeyBytes)
	}
	w := *s
	if _, err := rand.Read(w.WriteID[:]); err != nil {
		return 0, fmt.Errorf("snapshot write id: %w", err)
	}
	b := Encode(&w)
	c, _ := json.Marshal(companion{Version: Version, Alg: alg, WriteID: hex.EncodeToString(w.WriteID[:]),
		Size: len(b), MAC: hex.EncodeToString(mac(key, b))})
	var h1, h2 func(int) error
	if hook != nil {
		h1 = hook
		h2 = func(st int) error { return hook(st + 4) }
	}
	if err := integrity.WriteFileSteps(path, b, h1); err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	if err := integrity.WriteFileSteps(CompanionPath(path), append(c, '\n'), h2); err != nil {
		return 0, fmt.Errorf("snapshot companion: %w", err)
	}
	return len(b), nil
}

// Reason says why a snapshot was not loaded; the values are a metric's
// label values.
type Reason string

// The reasons Read refuses a snapshot, and the replica-set mismatch the
// caller finds when no replica of it is in the pool.
const (
	Missing Reason = "missing" // no snapshot file
	// Incomplete: the companion is missing or vouches for another write
	// (write id, size) than the snapshot's: a write interrupted between
	// the two files, or a file removed or replaced.
	Incomplete    Reason = "incomplete"
	Tampered      Reason = "tampered"       // the companion is malformed, or vouches for this write and does not verify
	ShapeMismatch Reason = "shape_mismatch" // another format version, index shape or replica set
	TooOld        Reason = "too_old"        // written longer ago than the maximum age
	TooLarge      Reason = "too_large"      // past the size bound
	Unreadable    Reason = "unreadable"     // an I/O error, or a verified file that does not decode
)

// Reasons are every Reason, for metrics.
var Reasons = []Reason{Missing, Incomplete, Tampered, ShapeMismatch, TooOld, TooLarge, Unreadable}

// Error is Read's error: why the snapshot was refused.
type Error struct {
	Reason Reason
	Err    error
}

func (e *Error) Error() string { return string(e.Reason) + ": " + e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

func refuse(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Err: fmt.Errorf(format, args...)}
}

// ReadOptions bound what Read accepts.
type ReadOptions struct {
	Key      []byte
	Shape    Shape         // the shape the index has now
	MaxAge   time.Duration // older snapshots are refused (0: any age)
	MaxBytes int64         // larger snapshot files are refused (0: DefaultMaxBytes)
	Now      time.Time     // the current time (zero: time.Now)
}

// Read loads the snapshot at path when its companion verifies under
// o.Key, its shape is o.Shape and it is younger than o.MaxAge; otherwise
// the error is an *Error saying why.
func Read(path string, o ReadOptions) (*Snapshot, error) {
	maxBytes := o.MaxBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	b, err := readBounded(path, maxBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, refuse(Missing, "no snapshot at %s", path)
	case errors.Is(err, errTooLarge):
		return nil, refuse(TooLarge, "%s is larger than %d bytes", path, maxBytes)
	case err != nil:
		return nil, &Error{Reason: Unreadable, Err: err}
	}
	cb, err := readBounded(CompanionPath(path), maxCompanionBytes)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, refuse(Incomplete, "companion %s is missing (a write interrupted before it, or the file removed)", CompanionPath(path))
	case errors.Is(err, errTooLarge):
		return nil, refuse(Tampered, "companion %s is larger than %d bytes", CompanionPath(path), maxCompanionBytes)
	case err != nil:
		return nil, &Error{Reason: Unreadable, Err: err}
	}
	var c companion
	if err := json.Unmarshal(cb, &c); err != nil || c.Alg != alg {
		return nil, refuse(Tampered, "companion %s is not a %s companion", CompanionPath(path), alg)
	}
	if c.Version != Version {
		return nil, refuse(ShapeMismatch, "companion %s has format version %d, want %d", CompanionPath(path), c.Version, Version)
	}
	if len(b) < headerBytes || !bytes.Equal(b[:8], magic[:]) {
		return nil, refuse(Tampered, "%s is not a ramjet snapshot", path)
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != Version {
		return nil, refuse(ShapeMismatch, "%s has format version %d, want %d", path, v, Version)
	}
	// The pair must belong together before the MAC can say anything: a
	// companion of another write is an interrupted write, not an
	// alteration. (Both fields are outside the MAC's proof; forging them
	// only turns a refusal into another refusal.)
	if id := hex.EncodeToString(b[12 : 12+WriteIDBytes]); c.WriteID != id || c.Size != len(b) {
		return nil, refuse(Incomplete, "companion %s vouches for write %.8s of %d bytes, the snapshot is write %.8s of %d bytes (a write interrupted between the two files, or one of them replaced)",
			CompanionPath(path), c.WriteID, c.Size, id, len(b))
	}
	want, err := hex.DecodeString(c.MAC)
	if err != nil || !hmac.Equal(want, mac(o.Key, b)) {
		return nil, refuse(Tampered, "companion %s does not verify the snapshot it vouches for (altered, or another key)", CompanionPath(path))
	}
	s, err := Decode(b)
	if errors.Is(err, errVersion) {
		return nil, &Error{Reason: ShapeMismatch, Err: err}
	}
	if err != nil {
		return nil, &Error{Reason: Unreadable, Err: fmt.Errorf("decoding %s: %w", path, err)}
	}
	if s.Shape != o.Shape {
		return nil, refuse(ShapeMismatch, "snapshot has %v, the index has %v", s.Shape, o.Shape)
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	if age := now.Sub(s.Written); o.MaxAge > 0 && age > o.MaxAge {
		return nil, refuse(TooOld, "written %s ago, max_age is %s", age.Round(time.Second), o.MaxAge)
	}
	return s, nil
}

var errTooLarge = errors.New("too large")

// readBounded reads at most limit bytes of name; a larger file is
// errTooLarge.
func readBounded(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	if int64(len(b)) > limit {
		return nil, errTooLarge
	}
	return b, nil
}
