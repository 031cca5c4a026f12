package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/ramjet-llm/ramjet/directive"
	_ "github.com/ramjet-llm/ramjet/module"
)

// The quick-start demo: the production config in front of four simulated
// engines, driven by agents through the OpenAI SDK, stops cleanly.
func TestDemoRuns(t *testing.T) {
	var out bytes.Buffer
	sum, err := Run(context.Background(), Options{
		Listen:      "127.0.0.1:0", // Run binds them and hands them to Caddy
		OpsListen:   "127.0.0.1:0",
		AdminListen: "127.0.0.1:0",
		Duration:    6 * time.Second,
		Interval:    time.Second,
		TimeScale:   8,
		Out:         &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(sum)
	if sum.Requests < 20 || sum.Errors != 0 {
		t.Fatalf("requests %d errors %d", sum.Requests, sum.Errors)
	}
	if len(sum.PerUpstream) < 3 {
		t.Fatalf("only %d of 4 replicas used: %v", len(sum.PerUpstream), sum.PerUpstream)
	}
	if sum.CachedShare() < 0.5 {
		t.Fatalf("cached share %.2f: sessions are not kept on warm replicas", sum.CachedShare())
	}
	for _, want := range []string{"/v1", "/health", "/metrics", "final:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	for id := range sum.PerUpstream {
		if strings.Contains(id, "127.0.0.1") || strings.Contains(id, ":") {
			t.Errorf("route id %q looks like an address", id)
		}
	}
}
