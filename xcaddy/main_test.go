package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildBinary builds this command once per test run into a temporary
// directory, as `go build -o ramjet ./xcaddy` does.
func buildBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "ramjet-xcaddy-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "ramjet")
		if runtime.GOOS == "windows" {
			binPath += ".exe"
		}
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Stderr = os.Stderr
		binErr = cmd.Run()
	})
	if binErr != nil {
		t.Fatalf("go build: %v", binErr)
	}
	return binPath
}

func TestBinary(t *testing.T) {
	bin := buildBinary(t)

	t.Run("list-modules", func(t *testing.T) {
		out, err := exec.Command(bin, "list-modules").CombinedOutput()
		if err != nil {
			t.Fatalf("list-modules: %v\n%s", err, out)
		}
		mods := map[string]bool{}
		for _, l := range strings.Split(string(out), "\n") {
			mods[strings.TrimSpace(l)] = true
		}
		for _, want := range []string{
			"http.reverse_proxy.selection_policies.ramjet",
			"http.matchers.ramjet_body",
			"http.handlers.ramjet_observe",
			"http.handlers.reverse_proxy", // the standard modules are in too
		} {
			if !mods[want] {
				t.Errorf("list-modules lacks %s", want)
			}
		}
	})

	// `caddy adapt` of every documented example matches its golden file.
	t.Run("adapt", func(t *testing.T) {
		files, err := filepath.Glob("../caddyfile/testdata/*.caddyfile")
		if err != nil || len(files) == 0 {
			t.Fatalf("no examples: %v", err)
		}
		for _, file := range files {
			out, err := exec.Command(bin, "adapt", "--config", file, "--adapter", "caddyfile").Output()
			if err != nil {
				t.Fatalf("adapt %s: %v", file, err)
			}
			want, err := os.ReadFile(strings.TrimSuffix(file, ".caddyfile") + ".json")
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := json.Indent(&got, bytes.TrimSpace(out), "", "\t"); err != nil {
				t.Fatalf("adapt %s: %v\n%s", file, err, out)
			}
			got.WriteByte('\n')
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("adapt %s differs from its golden file:\n%s", file, got.Bytes())
			}
		}
	})
}

// TestXcaddyBuild checks the documented plugin route,
//
//	xcaddy build v2.11.9 --with github.com/ramjet-llm/ramjet=./
//
// It rebuilds Caddy from scratch (about ten minutes on two cores), so it
// runs only with RAMJET_TEST_XCADDY=1 and xcaddy on PATH
// (go install github.com/caddyserver/xcaddy/cmd/xcaddy@v0.4.5).
// RAMJET_XCADDY_VERSION=v0.0.0-00010101000000-000000000000 pins the
// replaced module's version, for module proxies that answer 403 instead of
// 404 for unknown modules.
func TestXcaddyBuild(t *testing.T) {
	if os.Getenv("RAMJET_TEST_XCADDY") != "1" {
		t.Skip("set RAMJET_TEST_XCADDY=1 to build with xcaddy")
	}
	xc, err := exec.LookPath("xcaddy")
	if err != nil {
		t.Fatalf("xcaddy not on PATH: %v", err)
	}
	with := "github.com/ramjet-llm/ramjet"
	if v := os.Getenv("RAMJET_XCADDY_VERSION"); v != "" {
		with += "@" + v
	}
	bin := filepath.Join(t.TempDir(), "caddy")
	cmd := exec.Command(xc, "build", "v2.11.9", "--output", bin, "--with", with+"=../")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("xcaddy build: %v", err)
	}
	out, err := exec.Command(bin, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("list-modules: %v\n%s", err, out)
	}
	for _, want := range []string{"http.reverse_proxy.selection_policies.ramjet", "http.matchers.ramjet_body", "http.handlers.ramjet_observe"} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("xcaddy-built binary lacks %s", want)
		}
	}
}
