package module

// The listener wrapper caddy.listeners.ramjet_handover (package handover)
// is registered with ramjet's modules: deploy/Caddyfile enables it.
import _ "github.com/ramjet-llm/ramjet/handover"
