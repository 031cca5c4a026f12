package integrity

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var testKey = []byte("0123456789abcdef-test-key")

func commit(n int) string { return Commitment(testKey, testIdentity(fmt.Sprint("inst-", n)), -1) }

func TestStoreRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	s, err := OpenStore(path, testKey)
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 0 {
		t.Fatalf("new store has %d commitments", s.Len())
	}
	for i := range 3 {
		if err := s.Add(commit(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path + ".dirty"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dirty marker left after a completed mutation: %v", err)
	}
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), "inst-") {
		t.Fatalf("state file holds an instance id: %s", b)
	}
	s2, err := OpenStore(path, testKey)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if !s2.Has(commit(i)) {
			t.Errorf("commitment %d lost across reopen", i)
		}
	}
	if s2.Has(commit(9)) {
		t.Error("unknown commitment reported")
	}
}

func TestStoreRefusesTamperedOrForeignFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	s, _ := OpenStore(path, testKey)
	if err := s.Add(commit(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStore(path, []byte("another-key-of-16-bytes")); err == nil || !strings.Contains(err.Error(), "seal") {
		t.Fatalf("opened under another key: %v", err)
	}
	b, _ := os.ReadFile(path)
	// Drop the commitment but keep the old seal.
	tampered := strings.Replace(string(b), commit(1), commit(2), 1)
	os.WriteFile(path, []byte(tampered), 0o600)
	if _, err := OpenStore(path, testKey); err == nil {
		t.Fatal("opened a tampered state file")
	}
	os.WriteFile(path, []byte("{not json"), 0o600)
	if _, err := OpenStore(path, testKey); err == nil {
		t.Fatal("opened a torn state file")
	}
	if _, err := OpenStore(path, []byte("short")); err == nil {
		t.Fatal("accepted a short key")
	}
}

func TestStoreBounded(t *testing.T) {
	s, _ := OpenStore(filepath.Join(t.TempDir(), "s"), testKey)
	s.mu.Lock()
	for i := range MaxCommitments + 10 {
		s.add(commit(i))
	}
	s.mu.Unlock()
	if s.Len() != MaxCommitments || s.Has(commit(0)) || !s.Has(commit(MaxCommitments+9)) {
		t.Fatalf("len %d, oldest kept %v", s.Len(), s.Has(commit(0)))
	}
}

// TestStoreCrashAtEveryStep interrupts a mutation at every step (and the
// resolution of its marker at the next start at every step) and restarts
// from what is on disk: a commitment that was fenced before is always
// still fenced, and one whose Add returned nil too.
func TestStoreCrashAtEveryStep(t *testing.T) {
	for crash := range numSteps + 1 {
		for resolveCrash := range numSteps + 1 {
			t.Run(fmt.Sprintf("add_%d_resolve_%d", crash, resolveCrash), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "state.json")
				s, err := OpenStore(path, testKey)
				if err != nil {
					t.Fatal(err)
				}
				before := []string{commit(1), commit(2)}
				for _, c := range before {
					if err := s.Add(c); err != nil {
						t.Fatal(err)
					}
				}
				// The process dies at step crash of adding commit(3).
				s.hook = func(st Step) error {
					if st == crash {
						return errCrash
					}
					return nil
				}
				addErr := s.Add(commit(3))
				if crash < numSteps && !errors.Is(addErr, errCrash) {
					t.Fatalf("crash at step %d: Add returned %v", crash, addErr)
				}
				// Restart; the first start dies at step resolveCrash of
				// resolving the marker, the second starts cleanly.
				s1, err := openStore(path, testKey, func(st Step) error {
					if st == resolveCrash {
						return errCrash
					}
					return nil
				})
				if err != nil {
					t.Fatalf("restart after a crash at step %d: %v", crash, err)
				}
				s2, err := OpenStore(path, testKey)
				if err != nil {
					t.Fatalf("second restart: %v", err)
				}
				for _, st := range []*Store{s1, s2} {
					for _, c := range before {
						if !st.Has(c) {
							t.Fatalf("crash at step %d (resolve %d) un-fenced a fenced instance", crash, resolveCrash)
						}
					}
					if addErr == nil && !st.Has(commit(3)) {
						t.Fatalf("a completed Add lost after a restart")
					}
				}
				if crash >= StepMarkerDirSync && !s2.Has(commit(3)) {
					// Once the marker is renamed into place the new
					// commitment is durable.
					t.Fatalf("crash at step %d: the marker's commitment is not fenced after restart", crash)
				}
				if s2.Dirty() {
					t.Fatal("a clean start left the marker unresolved")
				}
				m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp-*"))
				if len(m) != 0 {
					t.Fatalf("temporary files left after a clean start: %v", m)
				}
			})
		}
	}
}
