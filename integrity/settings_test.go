package integrity

import (
	"github.com/ramjet-llm/ramjet/upstream"
	"strings"
	"testing"
	"time"
)

func TestSettings(t *testing.T) {
	pin := strings.Repeat("ab", 32)
	pos := MaxPositions
	tests := []struct {
		name    string
		give    Settings
		wantErr string
	}{
		{"nothing", Settings{}, "at least one pin or spec_decode"},
		{"pin", Settings{Pins: Pins{ModelSHA256: pin}}, ""},
		{"scheme", Settings{Pins: Pins{ModelSHA256: pin}, Access: upstream.Access{Scheme: "ftp"}}, "scheme"},
		{"path", Settings{Pins: Pins{ModelSHA256: pin}, IdentityPath: "id"}, "identity_path"},
		{"spec observe", Settings{Spec: &SpecSettings{}}, ""},
		{"position", Settings{Spec: &SpecSettings{Position: &pos}}, "position"},
		{"enforce without file", Settings{Spec: &SpecSettings{Mode: "enforce", Key: []byte(strings.Repeat("k", 32))}}, "state_file"},
		{"enforce short key", Settings{Spec: &SpecSettings{Mode: "enforce", StateFile: "x", Key: []byte("short")}}, "commitment_key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.give
			s.Defaults()
			err := s.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
		})
	}
	var s Settings
	s.Spec = &SpecSettings{}
	s.Defaults()
	if time.Duration(s.Interval) != 10*time.Second || time.Duration(s.Timeout) != 2*time.Second || s.Scheme != "http" || s.IdentityPath != DefaultIdentityPath ||
		s.Spec.Mode != "observe" || time.Duration(s.Spec.Window) != 10*time.Second || s.Spec.Windows != 3 || s.Spec.MetricsPath != "/metrics" {
		t.Fatalf("defaults %+v %+v", s, *s.Spec)
	}
}

func TestSplitReplicaKey(t *testing.T) {
	tests := []struct {
		give     string
		wantDial string
		wantRank int
	}{
		{"127.0.0.1:8000", "127.0.0.1:8000", -1},
		{"127.0.0.1:8000#3", "127.0.0.1:8000", 3},
		{"host#x", "host#x", -1},
	}
	for _, tt := range tests {
		if dial, rank := splitReplicaKey(tt.give); dial != tt.wantDial || rank != tt.wantRank {
			t.Errorf("splitReplicaKey(%q) = %q, %d, want %q, %d", tt.give, dial, rank, tt.wantDial, tt.wantRank)
		}
	}
	var g *Service
	if g.Out(0) {
		t.Error("a nil Service holds a replica out")
	}
}
