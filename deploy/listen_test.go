package deploy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func TestListenPorts(t *testing.T) {
	for _, tt := range []struct {
		name    string
		give    map[string]string
		want    map[string]string
		wantErr string
	}{
		{"defaults", nil, map[string]string{"RAMJET_LISTEN_PORT": "8000", "RAMJET_METRICS_PORT": "9090"}, ""},
		{"hosts", map[string]string{"RJ_LISTEN": "127.0.0.1:18000", "RJ_METRICS_LISTEN": "[::1]:19090"}, map[string]string{"RAMJET_LISTEN_PORT": "18000", "RAMJET_METRICS_PORT": "19090"}, ""},
		{"port only", map[string]string{"RJ_LISTEN": ":8080"}, map[string]string{"RAMJET_LISTEN_PORT": "8080", "RAMJET_METRICS_PORT": "9090"}, ""},
		{"empty", map[string]string{"RJ_LISTEN": " "}, nil, "RJ_LISTEN is set but empty"},
		{"no port", map[string]string{"RJ_METRICS_LISTEN": "127.0.0.1"}, nil, `RJ_METRICS_LISTEN="127.0.0.1": want host:port`},
		{"bad port", map[string]string{"RJ_LISTEN": "127.0.0.1:http"}, nil, `port "http" is not a number`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ListenPorts(lookupIn(tt.give))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ListenPorts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckListenPorts(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		give       map[string]string
		wantErr    string
	}{
		{"defaults", "deploy/Caddyfile", nil, ""},
		{"derived", "/src/deploy/Caddyfile", map[string]string{"RJ_LISTEN": "127.0.0.1:18000", "RAMJET_LISTEN_PORT": "18000"}, ""},
		{"not derived", "deploy/Caddyfile", map[string]string{"RJ_LISTEN": "127.0.0.1:18000"}, `RJ_LISTEN says port 18000 but RAMJET_LISTEN_PORT is "8000"`},
		{"stale", "deploy/Caddyfile", map[string]string{"RAMJET_METRICS_PORT": "1"}, "RJ_METRICS_LISTEN says port 9090"},
		{"another file", "my.Caddyfile", map[string]string{"RJ_LISTEN": "127.0.0.1:18000"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckListenPorts(tt.file, lookupIn(tt.give))
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
