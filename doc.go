// Package ramjet is the plugin entry point for custom Caddy builds: importing
// it registers ramjet's Caddy modules (package module), so that
//
//	xcaddy build --with github.com/ramjet-llm/ramjet=./
//
// works from a checkout. The prebuilt command is ./xcaddy.
package ramjet
