package version

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/ramjet-llm/ramjet"},
		Deps:      []*debug.Module{{Path: CaddyModule, Version: "v2.11.9"}, {Path: "x/y", Version: "v1"}},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	got := fromBuildInfo(Info{Version: Version}, bi)
	want := Info{Version: Version, Commit: "0123456789abcdef0123", Modified: true, Caddy: "v2.11.9", GoVersion: "go1.26.8"}
	if got != want {
		t.Fatalf("fromBuildInfo = %+v, want %+v", got, want)
	}
	if s := got.String(); s != "ramjet "+Version+" (commit 0123456789ab+dirty, Caddy v2.11.9, go1.26.8)" {
		t.Fatalf("String() = %q", s)
	}

	// An -ldflags commit wins over the VCS stamp; no stamp reads "unknown".
	got = fromBuildInfo(Info{Version: Version, Commit: "release-sha"}, bi)
	if got.Commit != "release-sha" || got.Modified {
		t.Fatalf("ldflags commit: %+v", got)
	}
	got = fromBuildInfo(Info{Version: Version, Commit: "abc-dirty"}, bi)
	if got.Commit != "abc" || !got.Modified {
		t.Fatalf("build.sh dirty commit: %+v", got)
	}
	got = fromBuildInfo(Info{Version: Version}, &debug.BuildInfo{GoVersion: "go1.26.8"})
	if got.Commit != "unknown" || got.Caddy != "unknown" {
		t.Fatalf("no stamp: %+v", got)
	}
}

// TestChangelogHasVersion keeps the constant and CHANGELOG.md in step.
func TestChangelogHasVersion(t *testing.T) {
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(Version) {
		t.Fatalf("Version %q is not semver", Version)
	}
	b, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "## ["+Version+"]") {
		t.Fatalf("CHANGELOG.md has no section ## [%s]", Version)
	}
}
