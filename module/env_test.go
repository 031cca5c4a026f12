package module

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/dustin/go-humanize"

	"github.com/ramjet-llm/ramjet/selection"
)

func TestCheckRetired(t *testing.T) {
	tests := []struct {
		name    string
		give    []string
		wantErr []string
	}{
		{"clean", []string{"RJ_UPSTREAM=a:1", "PATH=/bin", "XMD_FOO=1", "md_lower=1"}, nil},
		{"one", []string{"RJ_UPSTREAM=a:1", "MD_UPSTREAM=a:1"}, []string{"MD_UPSTREAM", "RJ_UPSTREAM"}},
		{"several sorted", []string{"MD_ZETA=", "MD_ALPHA=1"}, []string{"MD_ALPHA (rename it to RJ_ALPHA), MD_ZETA (rename it to RJ_ZETA)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkRetired(tt.give)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

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
