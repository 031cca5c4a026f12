package integrity

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "f")
	for _, give := range []string{"first", "second, longer"} {
		if err := WriteFile(name, []byte(give)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != give {
			t.Fatalf("content = %q, want %q", got, give)
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".f.tmp-*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("x")); err == nil {
		t.Fatal("WriteFile into a missing directory: no error")
	}
}
