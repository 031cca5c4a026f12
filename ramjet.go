package ramjet

import (
	_ "github.com/ramjet-llm/ramjet/directive" // registers the ramjet Caddyfile directive
	_ "github.com/ramjet-llm/ramjet/module"    // registers the Caddy modules
)
