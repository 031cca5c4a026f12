package module

import (
	"os"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/ramjet-llm/ramjet/envcheck"
	// The listener wrapper caddy.listeners.ramjet_handover (package
	// handover) is registered with ramjet's modules: deploy/Caddyfile
	// enables it.
	_ "github.com/ramjet-llm/ramjet/handover"
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

// instanceID is the id this instance's router spills by
// (selection.Router.SetInstance): the instance_id setting with its
// placeholders replaced, else the host name (a Kubernetes pod's name, so
// a StatefulSet's ordinals), else none (the shared spill order).
func instanceID(setting string) string {
	if setting != "" {
		return caddy.NewReplacer().ReplaceAll(setting, "")
	}
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return h
}
