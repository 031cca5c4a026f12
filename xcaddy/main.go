// Command ramjet is Caddy with the standard modules and the ramjet modules
// built in: `go build -o ramjet ./xcaddy`.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// The standard Caddy modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The ramjet modules.
	_ "github.com/ramjet-llm/ramjet/module"
)

func main() {
	caddycmd.Main()
}
