package upstream

import "fmt"

// Access is how ramjet's own requests to the engines (identity checks,
// metrics scrapes) reach them: the scheme and the upstream token. The
// ramjet policy's engine_metrics and integrity configurations embed it,
// so that both read, default and check these fields alike.
type Access struct {
	// Scheme is how the engines are reached: "http" or "https".
	// Default: "http".
	Scheme string `json:"scheme,omitempty"`
	// UpstreamToken is sent to the engines as "Authorization: Bearer
	// <token>"; placeholders such as {env.RJ_UPSTREAM_TOKEN} are
	// resolved. Default: none.
	UpstreamToken string `json:"upstream_token,omitempty"`
}

// SetDefaults fills the scheme.
func (a *Access) SetDefaults() {
	if a.Scheme == "" {
		a.Scheme = "http"
	}
}

// ParseScheme accepts "http" and "https".
func ParseScheme(v string) (string, error) {
	if v != "http" && v != "https" {
		return "", fmt.Errorf("must be http or https, got %q", v)
	}
	return v, nil
}

// Validate names a bad scheme; what names the configuration.
func (a Access) Validate(what string) error {
	if _, err := ParseScheme(a.Scheme); err != nil {
		return fmt.Errorf("%s: scheme %w", what, err)
	}
	return nil
}
