package ramjet

import _ "github.com/ramjet-llm/ramjet/module" // registers the Caddy modules
