package integrity

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/upstream"
)

func TestResolved(t *testing.T) {
	resolve := func(s string) string { return strings.ReplaceAll(s, "{env.X}", "secret") }
	s := Settings{Access: upstream.Access{UpstreamToken: "t-{env.X}"}, Spec: &SpecSettings{CommitmentKey: "{env.X}-key"}}
	got := s.Resolved(resolve)
	if got.Token != "t-secret" || string(got.Spec.Key) != "secret-key" {
		t.Errorf("token %q key %q, want t-secret and secret-key", got.Token, got.Spec.Key)
	}
	if got.IdentityPath != DefaultIdentityPath || got.Spec.Mode != "observe" {
		t.Errorf("defaults not filled: %+v %+v", got, got.Spec)
	}
	if s.Spec.Key != nil || s.Spec.Mode != "" || s.Token != "" {
		t.Error("Resolved changed its receiver's settings")
	}
	if got.Fingerprint() != s.Resolved(resolve).Fingerprint() {
		t.Error("the same settings fingerprint differently")
	}
	other := s.Resolved(func(v string) string { return strings.ReplaceAll(v, "{env.X}", "other") })
	if other.Fingerprint() == got.Fingerprint() {
		t.Error("settings with other secrets share a fingerprint")
	}
	noSpec := Settings{Access: upstream.Access{UpstreamToken: "a"}}.Resolved(resolve)
	if noSpec.Spec != nil || noSpec.Fingerprint() == (Settings{}).Resolved(resolve).Fingerprint() {
		t.Error("the token does not reach the fingerprint")
	}
}

// TestAcquireStore: one store per state file, shared while it has a
// reference, refused under another key, opened afresh after the last
// release.
func TestAcquireStore(t *testing.T) {
	key := []byte(strings.Repeat("k", MinKeyBytes))
	path := filepath.Join(t.TempDir(), "state")
	a, releaseA, err := AcquireStore(path, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Add(commit(1)); err != nil {
		t.Fatal(err)
	}
	b, releaseB, err := AcquireStore(path, key)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("two stores open for one state file")
	}
	if _, _, err := AcquireStore(path, []byte(strings.Repeat("x", MinKeyBytes))); err == nil ||
		!strings.Contains(err.Error(), "in use under another commitment_key") {
		t.Fatalf("another key: %v", err)
	}
	if _, _, err := AcquireStore(path, []byte("short")); err == nil {
		t.Fatal("a short key was accepted")
	}
	releaseA()
	releaseA() // a second release of the same reference does nothing
	if c, releaseC, err := AcquireStore(path, key); err != nil || c != a {
		t.Fatalf("after one of two releases: store %p (want %p), %v", c, a, err)
	} else {
		releaseC()
	}
	releaseB()
	d, releaseD, err := AcquireStore(path, key)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseD()
	if d == a {
		t.Fatal("the store outlived its last reference")
	}
	if !d.Has(commit(1)) {
		t.Error("the reopened store lost the commitment written before")
	}
}
