package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/version"
)

func TestDefaultHealthURL(t *testing.T) {
	for listen, want := range map[string]string{
		"":                "http://127.0.0.1:8000/health",
		":8000":           "http://127.0.0.1:8000/health",
		"0.0.0.0:8080":    "http://127.0.0.1:8080/health",
		"[::]:9000":       "http://127.0.0.1:9000/health",
		"http://:7000":    "http://127.0.0.1:7000/health",
		"tcp/0.0.0.0:81":  "http://127.0.0.1:81/health",
		"not an address":  "http://127.0.0.1:8000/health",
		"127.0.0.1:18000": "http://127.0.0.1:18000/health",
	} {
		if got := defaultHealthURL(listen); got != want {
			t.Errorf("defaultHealthURL(%q) = %q, want %q", listen, got, want)
		}
	}
}

// TestCommands runs `ramjet version` and `ramjet healthcheck` from the
// built binary against a /health on 127.0.0.1 answering each state.
func TestCommands(t *testing.T) {
	bin := buildBinary(t)

	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("ramjet version: %v\n%s", err, out)
	}
	want := "ramjet " + version.Version + " (commit "
	if !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), "Caddy v2.") {
		t.Errorf("ramjet version = %q, want %q... with the Caddy version", out, want)
	}
	out, err = exec.Command(bin, "version", "--json").CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"version":"`+version.Version+`"`) || !strings.Contains(string(out), `"caddy":"v2.`) {
		t.Errorf("ramjet version --json = %q (%v)", out, err)
	}

	state := "ok"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		if state == "unhealthy" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintf(w, `{"status":%q,"healthy":1,"total":2}`, state)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		state  string
		strict bool
		code   int
	}{
		{"ok", false, 0}, {"degraded", false, 0}, {"degraded", true, 1}, {"unhealthy", false, 1},
	} {
		state = tc.state
		args := []string{"healthcheck", "--url", srv.URL + "/health", "--timeout", "5s"}
		if tc.strict {
			args = append(args, "--strict")
		}
		out, err := exec.Command(bin, args...).CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code {
			t.Errorf("healthcheck on %q (strict %v): exit %d, want %d\n%s", tc.state, tc.strict, code, tc.code, out)
		}
	}
	// Nothing listening: exit 1.
	srv.Close()
	if err := exec.Command(bin, "healthcheck", "--url", srv.URL+"/health", "--timeout", "2s").Run(); err == nil {
		t.Error("healthcheck passed with nothing listening")
	}
}
