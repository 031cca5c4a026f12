package module

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/ramjet-llm/ramjet/envcheck"
	"github.com/ramjet-llm/ramjet/integrity"
)

// TestDeployCaddyfileSessionShadow: the production Caddyfile turns the
// session shadow on from RJ_SESSION_SHADOW (the session key header) and
// leaves it off without it.
func TestDeployCaddyfileSessionShadow(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, envcheck.EnvPrefix) {
			t.Setenv(name, "")
		}
	}
	src := []byte(deployCaddyfile(t))
	adapt := func() *integrity.ShadowSettings {
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": "deploy/Caddyfile"})
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(out, []byte(`"session_shadow":`))
		if i < 0 {
			return nil
		}
		var c integrity.ShadowSettings
		if err := json.NewDecoder(bytes.NewReader(out[i+len(`"session_shadow":`):])).Decode(&c); err != nil {
			t.Fatal(err)
		}
		return &c
	}
	t.Setenv("RJ_UPSTREAM", "127.0.0.1:8100,127.0.0.1:8200")
	if c := adapt(); c != nil {
		t.Fatalf("session shadow on without RJ_SESSION_SHADOW: %+v", c)
	}
	t.Setenv("RJ_SESSION_SHADOW", "X-Conversation")
	if c := adapt(); c == nil || c.Header != "X-Conversation" {
		t.Fatalf("session shadow with RJ_SESSION_SHADOW=X-Conversation: %+v", c)
	}
}
