package edge

import (
	"fmt"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
)

// Defaults of the guard's settings.
const (
	// DefaultMaxBodySize is the largest request body the guard accepts by
	// default, 16 MiB: the policy's body bound, so that every accepted
	// body is also fingerprinted.
	DefaultMaxBodySize = 16 << 20
	// DefaultModelsTimeout bounds one fetch of all engines' model lists
	// (the guard's models_timeout, ramjet_models' timeout).
	DefaultModelsTimeout = 2 * time.Second
)

// GuardSettings are the ramjet_guard handler's own settings (the JSON of
// module.Guard besides the engines it shares with ramjet_models).
// SetDefaults fills the zero fields; Validate names the bad setting.
type GuardSettings struct {
	// ForwardClientAuth forwards the client's Authorization (and api-key)
	// headers to the engines when no upstream token is configured. Off by
	// default: client credentials stay at the edge.
	ForwardClientAuth bool `json:"forward_client_auth,omitempty"`

	// MaxBodySize is the largest accepted request body, in bytes. Default
	// 16 MiB. Larger bodies get 413.
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	// ModelCheck controls the 404 for models the fleet does not serve:
	// "on" (default) rejects them once at least one engine has listed its
	// models; "off" forwards every model name.
	ModelCheck string `json:"model_check,omitempty"`

	// ModelsTimeout bounds one fetch of the engines' model lists. Default 2s.
	ModelsTimeout duration.Duration `json:"models_timeout,omitempty"`

	// BodyTimeout bounds the reading of one request body; a client that
	// has not sent all of it by then gets 408 (slow or trickled uploads).
	// Default 60s.
	BodyTimeout duration.Duration `json:"body_timeout,omitempty"`

	// BodyMinRate is the lowest average rate, in bytes per second, at
	// which a request body must arrive after its first second; a client
	// trickling it slower gets 408 then, before body_timeout. Default 0
	// (off: only body_timeout bounds an upload).
	BodyMinRate int64 `json:"body_min_rate,omitempty"`

	// AllowPaths are the paths served besides the OpenAI API
	// (DefaultAllowedPaths): exact paths, or prefixes ending in "/*".
	// Every other path gets an OpenAI-shaped 404 and never reaches an
	// engine. Paths are compared after normalisation (see NormalizePath).
	AllowPaths []string `json:"allow_paths,omitempty"`
}

// SetDefaults fills the zero fields with the defaults.
func (g *GuardSettings) SetDefaults() {
	if g.MaxBodySize == 0 {
		g.MaxBodySize = DefaultMaxBodySize
	}
	if g.ModelCheck == "" {
		g.ModelCheck = "on"
	}
	if g.ModelsTimeout == 0 {
		g.ModelsTimeout = duration.Duration(DefaultModelsTimeout)
	}
	if g.BodyTimeout == 0 {
		g.BodyTimeout = duration.Duration(DefaultBodyTimeout)
	}
}

// Validate rejects bad values, naming the field.
func (g *GuardSettings) Validate() error {
	switch {
	case g.MaxBodySize < 0:
		return fmt.Errorf("max_body_size must be positive, got %d", g.MaxBodySize)
	case g.ModelCheck != "on" && g.ModelCheck != "off":
		return fmt.Errorf("model_check must be on or off, got %q", g.ModelCheck)
	case g.ModelsTimeout < 0:
		return fmt.Errorf("models_timeout must be positive, got %v", g.ModelsTimeout)
	case g.BodyMinRate < 0:
		return fmt.Errorf("body_min_rate must be positive, got %d", g.BodyMinRate)
	}
	for _, p := range g.AllowPaths {
		if err := CheckAllowPath(p); err != nil {
			return fmt.Errorf("allow_paths: %w", err)
		}
	}
	return nil
}
