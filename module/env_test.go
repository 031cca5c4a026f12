package module

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dustin/go-humanize"

	"github.com/ramjet-llm/ramjet/deploy"
	"github.com/ramjet-llm/ramjet/selection"
)

func TestCheckRetiredEnv(t *testing.T) {
	t.Setenv("MD_UPSTREAM_TOKEN", "x")
	err := CheckRetiredEnv()
	if err == nil || !strings.Contains(err.Error(), "MD_UPSTREAM_TOKEN (rename it to RJ_UPSTREAM_TOKEN)") {
		t.Fatalf("CheckRetiredEnv() = %v", err)
	}
}

func TestResolveSecret(t *testing.T) {
	t.Setenv("RJ_TEST_SECRET", " s3cret ")
	for give, want := range map[string]string{
		"plain":                 "plain",
		"{env.RJ_TEST_SECRET}":  "s3cret",
		"{env.RJ_TEST_MISSING}": "",
	} {
		if got := resolveSecret(give); got != want {
			t.Errorf("resolveSecret(%q) = %q, want %q", give, got, want)
		}
	}
}

// TestDeploySettingsDocumented: every RJ_* setting deploy/Caddyfile reads is
// in the deploy/README.md table, and every setting in the table is read.
func TestDeploySettingsDocumented(t *testing.T) {
	caddyfile, err := os.ReadFile("../deploy/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../deploy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	read := map[string]bool{}
	for _, m := range regexp.MustCompile(`\{(?:\$|env\.)(RJ_[A-Z0-9_]+)`).FindAllStringSubmatch(string(caddyfile), -1) {
		read[m[1]] = true
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(RJ_[A-Z0-9_]+)` \\|").FindAllStringSubmatch(string(readme), -1) {
		documented[m[1]] = true
	}
	if len(read) < 10 {
		t.Fatalf("found only %d settings in deploy/Caddyfile", len(read))
	}
	for name := range read {
		if !documented[name] {
			t.Errorf("%s is read by deploy/Caddyfile but not in the README table", name)
		}
	}
	for name := range documented {
		if !read[name] {
			t.Errorf("%s is in the README table but deploy/Caddyfile does not read it", name)
		}
	}
	if regexp.MustCompile(`\{(\$|env\.)MD_`).Match(caddyfile) {
		t.Error("deploy/Caddyfile reads a retired MD_ setting")
	}
}

// TestDeployDefaultsMatchSelection: the routing defaults in the README table
// are package selection's.
func TestDeployDefaultsMatchSelection(t *testing.T) {
	readme, err := os.ReadFile("../deploy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"RJ_AFFINITY_CAP":       selection.DefaultAffinityCap,
		"RJ_ALPHA":              selection.DefaultAlpha,
		"RJ_REQUEST_COST":       selection.DefaultRequestCost,
		"RJ_BLOCK_TOKENS":       selection.DefaultBlockTokens,
		"RJ_PREFIX_TOKENS":      selection.DefaultPrefixTokens,
		"RJ_CHARS_PER_TOKEN":    selection.DefaultCharsPerToken,
		"RJ_INDEX_BUDGET":       selection.DefaultIndexBudget,
		"RJ_LONG_OUTPUT_TOKENS": selection.DefaultLongOutputTokens,
		"RJ_TIE_EPSILON":        selection.DefaultTieEpsilon,
		"RJ_OUTPUT_WEIGHT":      selection.DefaultOutputWeight,
		"RJ_MAX_BODY_SIZE":      DefaultMaxBodySize,
	}
	row := regexp.MustCompile("(?m)^\\| `(RJ_[A-Z0-9_]+)` \\| `([^`]+)` \\|")
	found := 0
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		w, ok := want[m[1]]
		if !ok {
			continue
		}
		found++
		v, err := humanize.ParseBytes(m[2])
		got := float64(v)
		if err != nil || !strings.ContainsAny(m[2], "KMGiB") {
			got, err = strconv.ParseFloat(m[2], 64)
		}
		if err != nil || got != w {
			t.Errorf("README says %s defaults to %s, the code to %v", m[1], m[2], w)
		}
	}
	if found != len(want) {
		t.Errorf("found %d of the %d routing defaults in the README table", found, len(want))
	}
}

// TestDeployEnvMistakes: config mistakes stop the adaptation of
// deploy/Caddyfile with an error that names them. Issue 15, item 10.
func TestDeployEnvMistakes(t *testing.T) {
	directiveLine := 0
	for i, l := range strings.Split(string(deploy.Caddyfile), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "ramjet {$RJ_UPSTREAM}") {
			directiveLine = i + 1
		}
	}
	if directiveLine == 0 {
		t.Fatal("no ramjet directive in deploy/Caddyfile")
	}
	tests := []struct {
		name    string
		env     map[string]string
		want    []string
		notWant string
	}{
		{"typo", map[string]string{"RJ_UPSTREAM": "127.0.0.1:1", "RJ_ALHPA": "2"}, []string{"RJ_ALHPA (did you mean RJ_ALPHA?)"}, ""},
		{"two unknown", map[string]string{"RJ_UPSTREAM": "127.0.0.1:1", "RJ_MAX_FAIL": "2", "RJ_WHATEVER_THIS_IS": "1"},
			[]string{"RJ_MAX_FAIL (did you mean RJ_MAX_FAILS?), RJ_WHATEVER_THIS_IS;"}, ""},
		{"retired upstream alone", map[string]string{"RJ_UPSTREAM": "", "MD_UPSTREAM": "127.0.0.1:1"},
			[]string{"MD_UPSTREAM (rename it to RJ_UPSTREAM)"}, "needs at least one upstream"},
		{"empty listen", map[string]string{"RJ_UPSTREAM": "127.0.0.1:1", "RJ_LISTEN": ""}, []string{"RJ_LISTEN is set but empty"}, ""},
		{"empty metrics listen", map[string]string{"RJ_UPSTREAM": "127.0.0.1:1", "RJ_METRICS_LISTEN": " "}, []string{"RJ_METRICS_LISTEN is set but empty"}, ""},
		{"no upstream", map[string]string{"RJ_UPSTREAM": ""},
			[]string{"deploy/Caddyfile:" + strconv.Itoa(directiveLine) + " ", "needs at least one upstream"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v) // restored when the test ends
			}
			_, err := deploy.Adapt(tt.env)
			if err == nil {
				t.Fatal("adapted without an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if tt.notWant != "" && strings.Contains(err.Error(), tt.notWant) {
				t.Errorf("error %q says %q", err, tt.notWant)
			}
		})
	}
	t.Setenv("RJ_UPSTREAM", "127.0.0.1:1")
	if _, err := deploy.Adapt(nil); err != nil {
		t.Errorf("a correct environment: %v", err)
	}
}
