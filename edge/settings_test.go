package edge

import (
	"strings"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/duration"
)

func TestGuardSettingsDefaults(t *testing.T) {
	var g GuardSettings
	g.SetDefaults()
	want := GuardSettings{MaxBodySize: DefaultMaxBodySize, ModelCheck: "on",
		ModelsTimeout: duration.Duration(DefaultModelsTimeout), BodyTimeout: duration.Duration(DefaultBodyTimeout)}
	if g.ForwardClientAuth != want.ForwardClientAuth || g.MaxBodySize != want.MaxBodySize || g.ModelCheck != want.ModelCheck ||
		g.ModelsTimeout != want.ModelsTimeout || g.BodyTimeout != want.BodyTimeout || g.BodyMinRate != 0 || g.AllowPaths != nil {
		t.Fatalf("defaults %+v, want %+v", g, want)
	}
	if err := g.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	set := GuardSettings{MaxBodySize: 1, ModelCheck: "off", ModelsTimeout: duration.Duration(time.Second), BodyTimeout: duration.Duration(time.Second)}
	kept := set
	kept.SetDefaults()
	if kept.MaxBodySize != 1 || kept.ModelCheck != "off" || kept.ModelsTimeout != set.ModelsTimeout || kept.BodyTimeout != set.BodyTimeout {
		t.Errorf("SetDefaults replaced given values: %+v", kept)
	}
}

func TestGuardSettingsValidate(t *testing.T) {
	tests := []struct {
		name    string
		give    GuardSettings
		wantErr string
	}{
		{name: "ok", give: GuardSettings{AllowPaths: []string{"/tokenize", "/v1/audio/*"}}},
		{name: "max_body_size", give: GuardSettings{MaxBodySize: -1}, wantErr: "max_body_size must be positive, got -1"},
		{name: "model_check", give: GuardSettings{ModelCheck: "maybe"}, wantErr: `model_check must be on or off, got "maybe"`},
		{name: "models_timeout", give: GuardSettings{ModelsTimeout: -1}, wantErr: "models_timeout must be positive"},
		{name: "body_min_rate", give: GuardSettings{BodyMinRate: -1}, wantErr: "body_min_rate must be positive, got -1"},
		{name: "allow_paths glob", give: GuardSettings{AllowPaths: []string{"/a*"}}, wantErr: "allow_paths:"},
		{name: "allow_paths relative", give: GuardSettings{AllowPaths: []string{"tokenize"}}, wantErr: "allow_paths:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := tt.give
			g.SetDefaults()
			err := g.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}
