package module

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// RetiredEnvPrefix is the prefix of the settings of ramjet's predecessor.
// Any environment variable that carries it stops ramjet at startup, so that
// a stale overlay fails loudly instead of running a differently tuned proxy.
const RetiredEnvPrefix = "MD_"

// EnvPrefix is the prefix of every ramjet setting.
const EnvPrefix = "RJ_"

// CheckRetiredEnv returns an error naming every environment variable with
// the retired MD_ prefix and its RJ_ replacement, or nil.
func CheckRetiredEnv() error {
	return checkRetired(os.Environ())
}

func checkRetired(environ []string) error {
	var bad []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, RetiredEnvPrefix) {
			bad = append(bad, name)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	parts := make([]string, len(bad))
	for i, name := range bad {
		parts[i] = fmt.Sprintf("%s (rename it to %s%s)", name, EnvPrefix, strings.TrimPrefix(name, RetiredEnvPrefix))
	}
	return fmt.Errorf("retired environment settings found: %s; the %s prefix is no longer read, unset or rename them",
		strings.Join(parts, ", "), RetiredEnvPrefix)
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
