// Package version names this build of ramjet: the release (a constant,
// kept in step with CHANGELOG.md), the commit it was built from and the
// Caddy version it embeds. It uses only the standard library.
package version
