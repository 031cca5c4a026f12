package version

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Version is the ramjet release. CHANGELOG.md has a section for it.
const Version = "0.1.0"

// Commit is the source revision. Release builds may set it with
// -ldflags "-X github.com/ramjet-llm/ramjet/version.Commit=<sha>"; when
// empty it is read from the VCS stamp Go records in the binary.
var Commit string

// CaddyModule is the module path of Caddy in the build information.
const CaddyModule = "github.com/caddyserver/caddy/v2"

// Info is everything `ramjet version` reports.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified,omitempty"`
	Caddy     string `json:"caddy"`
	GoVersion string `json:"go"`
}

// Get reads Info from the running binary.
func Get() Info {
	info := Info{Version: Version, Commit: Commit, Caddy: "unknown", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		if info.Commit == "" {
			info.Commit = "unknown"
		}
		return info
	}
	return fromBuildInfo(info, bi)
}

func fromBuildInfo(info Info, bi *debug.BuildInfo) Info {
	info.GoVersion = bi.GoVersion
	for _, d := range bi.Deps {
		if d.Path == CaddyModule {
			info.Caddy = d.Version
			if d.Replace != nil {
				info.Caddy = d.Replace.Version
			}
		}
	}
	if bi.Main.Path == CaddyModule {
		info.Caddy = bi.Main.Version
	}
	if info.Commit == "" {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Commit = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if c, ok := strings.CutSuffix(info.Commit, "-dirty"); ok {
		// deploy/docker/build.sh marks builds of a modified tree.
		info.Commit, info.Modified = c, true
	}
	if info.Commit == "" {
		info.Commit = "unknown"
	}
	if info.Caddy == "" {
		info.Caddy = "unknown"
	}
	return info
}

// String is the one-line form: "ramjet 0.1.0 (commit abc123, Caddy v2.11.9, go1.26)".
func (i Info) String() string {
	commit := i.Commit
	if len(commit) > 12 && !strings.Contains(commit, " ") {
		commit = commit[:12]
	}
	if i.Modified {
		commit += "+dirty"
	}
	return fmt.Sprintf("ramjet %s (commit %s, Caddy %s, %s)", i.Version, commit, i.Caddy, i.GoVersion)
}
