package deploy

import (
	_ "embed"
	"fmt"
	"os"
	"sync"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	// The Caddyfile adapter.
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

// Caddyfile is deploy/Caddyfile.
//
//go:embed Caddyfile
var Caddyfile []byte

var envMu sync.Mutex

// Adapt adapts the production Caddyfile to Caddy's JSON with the given
// RJ_* settings. Caddyfile environment placeholders ({$RJ_*}) are read from
// the process environment when the file is parsed, so the settings are set
// there for the duration of the call (and left set: {env.*} placeholders
// are read again at run time), with the listen ports derived from them
// (SetListenPorts).
func Adapt(settings map[string]string) ([]byte, error) {
	envMu.Lock()
	defer envMu.Unlock()
	for k, v := range settings {
		if err := os.Setenv(k, v); err != nil {
			return nil, fmt.Errorf("setting %s: %w", k, err)
		}
	}
	if err := SetListenPorts(); err != nil {
		return nil, err
	}
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(Caddyfile, map[string]any{"filename": "deploy/Caddyfile"})
	if err != nil {
		return nil, fmt.Errorf("adapting deploy/Caddyfile: %w", err)
	}
	return cfg, nil
}
