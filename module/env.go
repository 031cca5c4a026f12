package module

import (
	"os"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/ramjet-llm/ramjet/envcheck"
)

// CheckRetiredEnv returns an error naming every environment variable with
// the retired MD_ prefix and its RJ_ replacement, or nil
// (envcheck.Retired).
func CheckRetiredEnv() error {
	return envcheck.Retired(os.Environ())
}

// resolveSecret resolves global placeholders such as {env.RJ_UPSTREAM_TOKEN}
// in s once, so that a secret can stay out of the stored config. Unknown
// placeholders resolve to empty.
func resolveSecret(s string) string {
	if !strings.Contains(s, "{") {
		return s
	}
	return strings.TrimSpace(caddy.NewReplacer().ReplaceAll(s, ""))
}
