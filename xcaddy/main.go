package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// The standard Caddy modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The ramjet modules.
	"github.com/ramjet-llm/ramjet/deploy"
	_ "github.com/ramjet-llm/ramjet/directive"
	_ "github.com/ramjet-llm/ramjet/module"
	"github.com/ramjet-llm/ramjet/version"
)

func main() {
	// Caddy registers `version` itself (its own version only), so ramjet's
	// is answered before Caddy's command line takes over.
	if len(os.Args) > 1 && os.Args[1] == "version" {
		os.Exit(printVersion(os.Stdout, os.Args[2:]))
	}
	// deploy/Caddyfile binds RJ_LISTEN's host and needs its port apart.
	if err := deploy.SetListenPorts(); err != nil {
		fmt.Fprintln(os.Stderr, "ramjet:", err)
		os.Exit(1)
	}
	caddycmd.Main()
}

// printVersion writes the version line, or JSON with --json.
func printVersion(w io.Writer, args []string) int {
	info := version.Get()
	for _, a := range args {
		switch a {
		case "--json", "-json":
			b, _ := json.Marshal(info)
			fmt.Fprintln(w, string(b))
			return 0
		default:
			fmt.Fprintf(os.Stderr, "ramjet version: unknown argument %q (only --json)\n", a)
			return 2
		}
	}
	fmt.Fprintln(w, info.String())
	return 0
}
