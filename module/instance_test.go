package module

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ramjet-llm/ramjet/selection"
)

// instance_id reaches the router through Caddyfile, JSON and Provision
// (placeholders replaced); without it the host name does.
func TestPolicyInstanceID(t *testing.T) {
	t.Setenv("RAMJET_TEST_POD", "ramjet-3")
	host, _ := os.Hostname()
	tests := []struct {
		name  string
		block string
		want  string
	}{
		{"ordinal", "ramjet {\n instance_id ramjet-2\n state_key inst_a\n}", "ramjet-2"},
		{"placeholder", "ramjet {\n instance_id {env.RAMJET_TEST_POD}\n state_key inst_b\n}", "ramjet-3"},
		{"default host name", "ramjet {\n state_key inst_c\n}", host},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q RamjetSelection
			if err := q.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.block)); err != nil {
				t.Fatal(err)
			}
			if b, _ := json.Marshal(&q); (q.InstanceID != "") != strings.Contains(string(b), `"instance_id":`) {
				t.Fatalf("JSON %s for instance_id %q", b, q.InstanceID)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			if err := q.Provision(ctx); err != nil {
				t.Fatal(err)
			}
			defer q.Cleanup()
			if got, want := q.rt.Instance(), selection.InstancePosition(tt.want); got != want {
				t.Errorf("router position %#x, want %#x (id %q)", got, want, tt.want)
			}
		})
	}
	var p RamjetSelection
	err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser("ramjet {\n instance_id a\n instance_id b\n}"))
	if err == nil {
		t.Error("instance_id twice: no error")
	}
}
