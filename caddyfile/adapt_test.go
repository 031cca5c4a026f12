package caddyfile

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/ramjet-llm/ramjet/directive"
	_ "github.com/ramjet-llm/ramjet/module"
)

var update = flag.Bool("update", false, "rewrite the golden JSON files")

// adapt runs Caddy's Caddyfile adapter, as `caddy adapt` does.
func adapt(t *testing.T, name string, src []byte) ([]byte, error) {
	t.Helper()
	out, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": name})
	if err != nil {
		return nil, err
	}
	for _, w := range warns {
		t.Errorf("%s: adapter warning: %s", name, w.String())
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, out, "", "\t"); err != nil {
		return nil, err
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

// TestAdaptGolden adapts every example Caddyfile and compares the JSON
// with its golden file, then provisions the config (caddy.Validate).
func TestAdaptGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.caddyfile")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".caddyfile")
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := adapt(t, file, src)
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			golden := strings.TrimSuffix(file, ".caddyfile") + ".json"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("golden file: %v (run go test ./caddyfile -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("adapted JSON differs from %s\n got:\n%s", golden, got)
			}
			var cfg caddy.Config
			if err := json.Unmarshal(got, &cfg); err != nil {
				t.Fatal(err)
			}
			if err := caddy.Validate(&cfg); err != nil {
				t.Fatalf("provisioning the adapted config: %v", err)
			}
		})
	}
}

// TestAdaptBadOptions checks that a bad option fails with an error that
// names it (and the file and line).
func TestAdaptBadOptions(t *testing.T) {
	tests := []struct {
		name    string
		give    string // inside reverse_proxy { lb_policy ramjet { ... } }
		wantErr string
	}{
		{"unknown", "alhpa 1", "ramjet: unrecognized option 'alhpa'"},
		{"duplicate", "alpha 1\nalpha 2", "ramjet: alpha specified more than once"},
		{"negative", "affinity_cap -5", `affinity_cap: "-5" is not a positive integer`},
		{"alpha", "alpha fast", `alpha: "fast" is not a number`},
		{"affinity_cap", "affinity_cap", "affinity_cap: missing value"},
		{"block_tokens", "block_tokens 1 2", "block_tokens: too many values"},
		{"index_budget", "index_budget lots", `index_budget: "lots" is not a size`},
		{"profile", "profile 127.0.0.1:8100 turbo", `profile 127.0.0.1:8100: unknown engine profile "turbo"`},
		{"fallback", "fallback nosuch", "fallback:"},
		{"foreign_prefill", "foreign_prefill yes", `foreign_prefill: "yes": want on, off or queues`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := ":8000 {\n\treverse_proxy 127.0.0.1:8100 {\n\t\tlb_policy ramjet {\n" + indent(tt.give) + "\n\t\t}\n\t}\n}\n"
			_, err := adapt(t, "Caddyfile", []byte(src))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "Caddyfile:") {
				t.Fatalf("error = %v, want it to contain %q and the file name", err, tt.wantErr)
			}
		})
	}

	// Values that parse but cannot work fail when the config is loaded,
	// again naming the option.
	loadTests := []struct {
		name    string
		give    string
		wantErr string
	}{
		{"alpha", "alpha -1", "alpha must be"},
		{"prefix_tokens", "block_tokens 64\nprefix_tokens 16", "prefix_tokens must be at least block_tokens"},
		{"chars_per_token", "chars_per_token 0.1", "chars_per_token must be between"},
		{"state_key", "state_key has/slash", "state_key must be"},
		{"foreign_prefill", "foreign_prefill on", "foreign_prefill on needs kv_events"},
	}
	for _, tt := range loadTests {
		t.Run("load/"+tt.name, func(t *testing.T) {
			src := ":8000 {\n\treverse_proxy 127.0.0.1:8100 {\n\t\tlb_policy ramjet {\n" + indent(tt.give) + "\n\t\t}\n\t}\n}\n"
			out, err := adapt(t, "Caddyfile", []byte(src))
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			var cfg caddy.Config
			if err := json.Unmarshal(out, &cfg); err != nil {
				t.Fatal(err)
			}
			err = caddy.Validate(&cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}

	// The matcher too.
	src := ":8000 {\n\t@m ramjet_body {\n\t\tmodle x\n\t}\n\trespond @m 200\n}\n"
	if _, err := adapt(t, "Caddyfile", []byte(src)); err == nil || !strings.Contains(err.Error(), "ramjet_body: unrecognized option 'modle'") {
		t.Fatalf("matcher: error = %v", err)
	}
}

// indent puts every line of s three tabs deep, as caddy fmt would.
func indent(s string) string {
	return "\t\t\t" + strings.ReplaceAll(s, "\n", "\n\t\t\t")
}
