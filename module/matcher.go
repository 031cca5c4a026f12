package module

import (
	"fmt"
	"net/http"
	"path"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/caddyblock"
	"github.com/ramjet-llm/ramjet/selection"
)

func init() {
	caddy.RegisterModule(BodyMatcher{})
}

// BodyMatcher matches OpenAI requests (POST /v1/chat/completions,
// /v1/completions, /v1/responses) by the fields of their JSON body. It
// reads the body once, bounded, restores it so that the upstream receives
// the identical bytes, and keeps the parsed features in the per-request
// state for the ramjet policy, which then does not parse the body again.
//
// A body that is not valid JSON, is larger than max_body_bytes, or is sent
// to another route does not match.
type BodyMatcher struct {
	// Models are globs (path.Match syntax: *, ?, [a-z]) of which the
	// request's "model" must match one. Empty matches every model.
	Models []string `json:"models,omitempty"`

	// MaxBodyBytes bounds how much of the body is read, in bytes. Default:
	// 16 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (BodyMatcher) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.matchers.ramjet_body",
		New: func() caddy.Module { return new(BodyMatcher) },
	}
}

// UnmarshalCaddyfile sets up the matcher from Caddyfile tokens. Syntax:
//
//	ramjet_body [<model globs...>] {
//		model          <globs...>
//		max_body_bytes <size>
//	}
//
// model may be repeated; the globs add up.
func (m *BodyMatcher) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	b := &caddyblock.Block{Name: "ramjet_body", Repeat: map[string]bool{"model": true},
		Custom: map[string]func(*caddyfile.Dispenser) error{"model": func(d *caddyfile.Dispenser) error {
			globs := d.RemainingArgs()
			if len(globs) == 0 {
				return d.Errf("model: want at least one glob")
			}
			m.Models = append(m.Models, globs...)
			return nil
		}}}
	for d.Next() {
		m.Models = append(m.Models, d.RemainingArgs()...)
		if err := b.Parse(d, m); err != nil {
			return err
		}
	}
	return nil
}

// Provision fills defaults.
func (m *BodyMatcher) Provision(caddy.Context) error {
	if m.MaxBodyBytes == 0 {
		m.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return nil
}

// Validate checks the globs and the size bound.
func (m *BodyMatcher) Validate() error {
	for _, g := range m.Models {
		if _, err := path.Match(g, ""); err != nil {
			return fmt.Errorf("models: bad glob %q: %w", g, err)
		}
	}
	if m.MaxBodyBytes < 0 {
		return fmt.Errorf("max_body_bytes must be positive, got %d", m.MaxBodyBytes)
	}
	return nil
}

// MatchWithError reports whether r is an OpenAI request whose body
// matches: the decoded "model" (Features.Model, as the guard and the
// policy see it) against the globs. It reuses the request's one parse (the
// guard's, when the guard ran first). Bodies that cannot be parsed do not
// match and are no error: the guard answers those with a 400.
func (m BodyMatcher) MatchWithError(r *http.Request) (bool, error) {
	if r.Method != http.MethodPost {
		return false, nil
	}
	ep := selection.EndpointForPath(r.URL.Path)
	if ep == selection.EndpointUnknown {
		return false, nil
	}
	st := requestState(nil, r)
	limit := m.MaxBodyBytes
	if limit == 0 {
		limit = DefaultMaxBodyBytes
	}
	st.readBody(r, limit)
	b := st.acquireBody()
	if b == nil {
		return false, nil
	}
	defer b.Release()
	f := st.features(sharedExtractor(), ep)
	if f == nil {
		return false, nil
	}
	if len(m.Models) == 0 {
		return true, nil
	}
	for _, g := range m.Models {
		if ok, _ := path.Match(g, string(f.Model)); ok {
			return true, nil
		}
	}
	return false, nil
}

// Match implements caddyhttp.RequestMatcher.
func (m BodyMatcher) Match(r *http.Request) bool {
	ok, _ := m.MatchWithError(r)
	return ok
}

// Interface guards.
var (
	_ caddyhttp.RequestMatcherWithError = (*BodyMatcher)(nil)
	_ caddy.Provisioner                 = (*BodyMatcher)(nil)
	_ caddy.Validator                   = (*BodyMatcher)(nil)
	_ caddyfile.Unmarshaler             = (*BodyMatcher)(nil)
)
