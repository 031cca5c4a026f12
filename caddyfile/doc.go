// Package caddyfile holds ramjet's documented example Caddyfiles
// (testdata/*.caddyfile) and the golden JSON each adapts to
// (testdata/*.json). Its tests adapt every example with Caddy's own
// Caddyfile adapter, compare the result with the golden file, load it to
// prove it provisions, and check that bad options fail with an error that
// names the option. Regenerate the golden files with
//
//	go test ./caddyfile -update
package caddyfile
