// Package vllm holds the vLLM side of ramjet's identity contract
// (ramjet_identity.py, docs/identity.md); its Go test runs the Python
// tests and checks the answer the middleware served with ramjet's own
// contract code.
package vllm

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ramjet-llm/ramjet/integrity"
)

// python finds an interpreter with Starlette and httpx (Debian's
// python3-starlette, python3-httpx), or skips.
func python(t *testing.T) string {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import starlette, httpx").Run() == nil {
			return p
		}
	}
	t.Skip("no python3 with starlette and httpx (apt-get install python3-starlette python3-httpx)")
	return ""
}

// TestMiddlewareWithStarlette runs test_ramjet_identity.py and checks the
// identity it served against the contract and the pins it computed, with
// package integrity (what ramjet runs).
func TestMiddlewareWithStarlette(t *testing.T) {
	py := python(t)
	dump := filepath.Join(t.TempDir(), "identity.json")
	cmd := exec.Command(py, "-m", "unittest", "-v", "test_ramjet_identity")
	cmd.Env = append(os.Environ(), "RAMJET_IDENTITY_DUMP="+dump, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	b, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Served integrity.Identity `json:"served"`
		Pins   integrity.Identity `json:"pins"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	pins := integrity.Pins{ModelSHA256: got.Pins.ModelSHA256, TemplateSHA256: got.Pins.TemplateSHA256,
		TokenizerSHA256: got.Pins.TokenizerSHA256}
	if err := pins.Validate(); err != nil {
		t.Fatalf("the CLI's digests are not pins: %v", err)
	}
	if r := pins.Check(got.Served); r != integrity.ReasonNone {
		t.Fatalf("served identity %+v fails its pins: %s", got.Served, r)
	}
	other := pins
	other.ModelSHA256 = got.Pins.TemplateSHA256
	if r := other.Check(got.Served); r != integrity.ReasonModelMismatch {
		t.Fatalf("a wrong pin: %s", r)
	}
}
