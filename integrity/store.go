package integrity

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// MaxCommitments bounds the state file: past it the oldest commitments
// are dropped (an instance fenced that long ago is assumed replaced).
const MaxCommitments = 4096

// MinKeyBytes is the shortest commitment key accepted.
const MinKeyBytes = 16

// Step names one step of a state-file mutation, in order, for the crash
// hook (Store.hook).
type Step int

// The steps of a mutation: the dirty marker is made durable first, then
// the state file, then the marker is removed.
const (
	StepMarkerWrite Step = iota
	StepMarkerSync
	StepMarkerRename
	StepMarkerDirSync
	StepStateWrite
	StepStateSync
	StepStateRename
	StepStateDirSync
	StepMarkerRemove
	StepMarkerRemoveDirSync
	numSteps
)

// errCrash is what a crash hook returns to stop a mutation at a step.
var errCrash = errors.New("simulated crash")

// Store is the durable set of quarantine commitments (Commitment). The
// state file holds them with an HMAC seal under the commitment key; the
// dirty marker (path + ".dirty") holds the commitments of a mutation in
// progress. A mutation writes the marker (temp file, fsync, rename, fsync
// of the directory), then the state file the same way, then removes the
// marker: after a crash at any step, Open finds every commitment that was
// durable before and every one being added, in the file or in the marker.
type Store struct {
	path string
	key  []byte

	mu    sync.Mutex
	list  []string // in insertion order
	set   map[string]bool
	dirty bool // a marker was found at Open and not yet resolved
	// hook, when set (tests), runs before each step; an error stops the
	// mutation there, as a crash would. At StepMarkerWrite and
	// StepStateWrite half of the bytes are written first (a torn write).
	hook func(Step) error
}

// sealed is the on-disk form of the state file and the marker.
type sealed struct {
	Version     int      `json:"version"`
	Kind        string   `json:"kind"` // "state" or "dirty"
	Commitments []string `json:"commitments"`
	MAC         string   `json:"mac"`
}

func (s *Store) seal(kind string, list []string) []byte {
	b, _ := json.Marshal(sealed{Version: 1, Kind: kind, Commitments: list, MAC: s.mac(kind, list)})
	return append(b, '\n')
}

func (s *Store) mac(kind string, list []string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte("ramjet-integrity/v1\x00" + kind + "\x00"))
	m.Write([]byte(strings.Join(list, "\n")))
	return hex.EncodeToString(m.Sum(nil))
}

func (s *Store) unseal(kind string, b []byte) ([]string, error) {
	var v sealed
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	if v.Version != 1 || v.Kind != kind {
		return nil, fmt.Errorf("not a version 1 %s file", kind)
	}
	if !hmac.Equal([]byte(v.MAC), []byte(s.mac(kind, v.Commitments))) {
		return nil, errors.New("seal does not verify (another key, or the file was altered)")
	}
	for _, c := range v.Commitments {
		if !isDigest(c) {
			return nil, fmt.Errorf("malformed commitment %q", c)
		}
	}
	return v.Commitments, nil
}

// OpenStore reads the state file at path (absent: empty) with key. A dirty
// marker left by a crash is merged in: its commitments are fenced, and the
// merged set is written back (Resolve) before OpenStore returns; when that
// write fails the marker stays and the merged set is still fenced in
// memory. A file or marker that does not verify is an error: the caller
// must not start unfenced on it.
func OpenStore(path string, key []byte) (*Store, error) {
	return openStore(path, key, nil)
}

func openStore(path string, key []byte, hook func(Step) error) (*Store, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("commitment key must be at least %d bytes", MinKeyBytes)
	}
	s := &Store{path: path, key: append([]byte(nil), key...), set: map[string]bool{}, hook: hook}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("reading state file: %w", err)
	default:
		list, err := s.unseal("state", b)
		if err != nil {
			return nil, fmt.Errorf("state file %s: %w", path, err)
		}
		s.add(list...)
	}
	b, err = os.ReadFile(s.marker())
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("reading dirty marker: %w", err)
	default:
		list, err := s.unseal("dirty", b)
		if err != nil {
			return nil, fmt.Errorf("dirty marker %s: %w", s.marker(), err)
		}
		s.add(list...)
		s.dirty = true
		_ = s.resolve() // on failure the marker stays; the set is fenced all the same
	}
	s.removeTemps()
	return s, nil
}

func (s *Store) marker() string { return s.path + ".dirty" }

// Dirty reports whether a crash's marker is still unresolved.
func (s *Store) Dirty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dirty
}

func (s *Store) add(cs ...string) {
	for _, c := range cs {
		if s.set[c] {
			continue
		}
		s.set[c] = true
		s.list = append(s.list, c)
	}
	for len(s.list) > MaxCommitments {
		delete(s.set, s.list[0])
		s.list = s.list[1:]
	}
}

// Has reports whether c is committed (fenced).
func (s *Store) Has(c string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.set[c]
}

// Len is the number of commitments.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.list)
}

// Add commits c durably: when it returns nil, c survives any crash.
// On an error c is held in memory (Has reports it) and may or may not be
// durable; Add again (or Resolve) to retry.
func (s *Store) Add(c string) error {
	if !isDigest(c) {
		return fmt.Errorf("malformed commitment %q", c)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pending := append(append([]string(nil), s.list...), c)
	if err := s.writeSealed(s.marker(), "dirty", pending, StepMarkerWrite); err != nil {
		s.add(c)
		return fmt.Errorf("writing dirty marker: %w", err)
	}
	s.add(c)
	s.dirty = true
	return s.commitLocked()
}

// Resolve writes the in-memory set to the state file and removes the
// marker (after a failed Add, or a marker found at Open).
func (s *Store) Resolve() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resolve()
}

func (s *Store) resolve() error {
	if !s.dirty {
		return nil
	}
	return s.commitLocked()
}

// commitLocked writes the state file and removes the marker.
func (s *Store) commitLocked() error {
	if err := s.writeSealed(s.path, "state", s.list, StepStateWrite); err != nil {
		return fmt.Errorf("writing state file: %w", err)
	}
	if err := s.step(StepMarkerRemove); err != nil {
		return err
	}
	if err := os.Remove(s.marker()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing dirty marker: %w", err)
	}
	if err := s.step(StepMarkerRemoveDirSync); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(s.path)); err != nil {
		return err
	}
	s.dirty = false
	return nil
}

func (s *Store) step(st Step) error {
	if s.hook == nil {
		return nil
	}
	return s.hook(st)
}

// writeSealed writes list to name through a temporary file: write, fsync,
// rename, fsync of the directory; first is the step of the write (the
// following steps are first+1..first+3).
func (s *Store) writeSealed(name, kind string, list []string, first Step) error {
	return writeAtomic(name, s.seal(kind, list), s.step, first)
}

// WriteFile replaces name with b durably and atomically: b goes to a
// temporary file in name's directory, which is fsynced and renamed over
// name, then the directory is fsynced. A reader sees the old content or
// all of b, never part of it; after a crash a temporary file may remain
// (named "."+base(name)+".tmp-*").
func WriteFile(name string, b []byte) error {
	return writeAtomic(name, b, nil, 0)
}

// WriteFileSteps is WriteFile with hook (nil: none) run before each of
// its steps: the write (0), the fsync (1), the rename (2) and the fsync
// of the directory (3). An error from hook stops it there as a crash
// would (at the write, half of b is left in the temporary file). For
// crash tests of files written with WriteFile.
func WriteFileSteps(name string, b []byte, hook func(step int) error) error {
	if hook == nil {
		return writeAtomic(name, b, nil, 0)
	}
	return writeAtomic(name, b, func(st Step) error { return hook(int(st)) }, 0)
}

// writeAtomic is WriteFile with the crash hook step (nil: none) run before
// each step, first being the step of the write.
func writeAtomic(name string, b []byte, step func(Step) error, first Step) error {
	if step == nil {
		step = func(Step) error { return nil }
	}
	dir := filepath.Dir(name)
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating temporary file: %w", err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := step(first); err != nil {
		_, _ = f.Write(b[:len(b)/2]) // a torn write: the crash leaves it behind
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		return fail(fmt.Errorf("writing %s: %w", tmp, err))
	}
	if err := step(first + 1); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("fsync %s: %w", tmp, err))
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("closing %s: %w", tmp, err)
	}
	if err := step(first + 2); err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("renaming into %s: %w", name, err)
	}
	if err := step(first + 3); err != nil {
		return err
	}
	return syncDir(dir)
}

// removeTemps removes temporary files a crash left behind.
func (s *Store) removeTemps() {
	dir := filepath.Dir(s.path)
	for _, base := range []string{filepath.Base(s.path), filepath.Base(s.marker())} {
		m, _ := filepath.Glob(filepath.Join(dir, "."+base+".tmp-*"))
		for _, p := range m {
			os.Remove(p)
		}
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync of directory %s: %w", dir, err)
	}
	return nil
}
