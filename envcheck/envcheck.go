package envcheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// RetiredEnvPrefix is the prefix of the settings of ramjet's predecessor.
// Any environment variable that carries it stops ramjet at startup, so that
// a stale overlay fails loudly instead of running a differently tuned proxy.
const RetiredEnvPrefix = "MD_"

// EnvPrefix is the prefix of every ramjet setting.
const EnvPrefix = "RJ_"

// Retired returns an error naming every variable of environ (KEY=value
// lines, as os.Environ) with the retired MD_ prefix and its RJ_
// replacement, or nil.
func Retired(environ []string) error {
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

// envRef matches a reference to an RJ_* setting in a Caddyfile: {$RJ_X},
// {$RJ_X:default} or {env.RJ_X}.
var envRef = regexp.MustCompile(`\{(?:\$|env\.)(` + EnvPrefix + `[A-Za-z0-9_]+)`)

// Names are the RJ_* names the Caddyfile src references.
func Names(src []byte) map[string]bool {
	out := map[string]bool{}
	for _, m := range envRef.FindAllSubmatch(src, -1) {
		out[string(m[1])] = true
	}
	return out
}

// Known are the RJ_* settings a Caddyfile being adapted may be given:
// those of base (the production Caddyfile's Names) and those file
// references. ok is false when file is neither deploy/Caddyfile nor
// readable (a config adapted from memory): what it references is then
// unknown.
func Known(file string, base map[string]bool) (known map[string]bool, ok bool) {
	known = map[string]bool{}
	for n := range base {
		known[n] = true
	}
	if filepath.ToSlash(file) == "deploy/Caddyfile" {
		return known, true
	}
	src, err := os.ReadFile(file)
	if err != nil {
		return known, false
	}
	for n := range Names(src) {
		known[n] = true
	}
	return known, true
}

// mustNotBeEmpty are the settings whose empty value Caddy would not read as
// "unset" (a site address, the admin address, a duration).
var mustNotBeEmpty = map[string]bool{
	"RJ_LISTEN": true, "RJ_METRICS_LISTEN": true, "RJ_ADMIN_LISTEN": true, "RJ_GRACE_PERIOD": true,
}

// Check returns an error naming every retired MD_* setting (see Retired)
// or, when known is not nil, every RJ_* setting in environ
// that is not in known, with the closest known name as a suggestion. A
// typo'd setting would otherwise be ignored silently.
func Check(environ []string, known map[string]bool) error {
	if err := Retired(environ); err != nil {
		return err
	}
	if known == nil {
		return nil
	}
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if mustNotBeEmpty[name] && known[name] && strings.TrimSpace(val) == "" {
			return fmt.Errorf("%s is set but empty: unset it to keep the default, or give an address (an empty listen address would serve every interface on port 80)", name)
		}
	}
	var bad []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) && !known[name] {
			bad = append(bad, name)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	parts := make([]string, len(bad))
	for i, name := range bad {
		parts[i] = name
		if s := Closest(name, known); s != "" {
			parts[i] += " (did you mean " + s + "?)"
		}
	}
	return fmt.Errorf("unknown environment settings: %s; ramjet reads only the %s settings its Caddyfile names (deploy/README.md lists them): fix or unset them",
		strings.Join(parts, ", "), EnvPrefix)
}

// Closest is the known name nearest to name by edit distance (with
// transpositions), if it is near enough to be a likely typo.
func Closest(name string, known map[string]bool) string {
	best, bestD := "", -1
	for k := range known {
		d := editDistance(name, k)
		if bestD < 0 || d < bestD || (d == bestD && k < best) {
			best, bestD = k, d
		}
	}
	limit := max(2, (len(name)-len(EnvPrefix))/3)
	if bestD < 0 || bestD > limit {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and adjacent transpositions.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
