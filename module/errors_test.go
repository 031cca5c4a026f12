package module

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/edge"
)

// wireError is the OpenAI error envelope as a client decodes it.
type wireError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func decodeWireError(t *testing.T, body []byte) wireError {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error body lacks error.%s: %s", k, body)
		}
	}
	var we wireError
	if err := json.Unmarshal(body, &we); err != nil {
		t.Fatal(err)
	}
	return we
}

func TestAPIErrorFromHandler(t *testing.T) {
	leak := errors.New("dial tcp 127.0.0.1:8123: connect: connection refused")
	tests := []struct {
		name       string
		give       error
		wantStatus int
		wantCode   string
	}{
		{"no upstream", caddyhttp.Error(http.StatusServiceUnavailable, errors.New("no upstreams available")), 503, edge.CodeNoReplica},
		{"dial failure", caddyhttp.Error(http.StatusBadGateway, leak), 502, edge.CodeUpstreamFailed},
		{"timeout", caddyhttp.Error(http.StatusGatewayTimeout, leak), 504, edge.CodeUpstreamTimeout},
		{"too large", caddyhttp.Error(http.StatusRequestEntityTooLarge, leak), 413, edge.CodeBodyTooLarge},
		{"plain error", leak, 500, edge.CodeInternal},
		{"client gone", caddyhttp.Error(499, leak), 499, "client_closed_request"},
		{"wrapped api error", fmt.Errorf("x: %w", edge.NewError(404, edge.TypeInvalidRequest, edge.CodeModelNotFound, "model", "m")), 404, edge.CodeModelNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ae := apiErrorFromHandler(tt.give)
			if ae.Status != tt.wantStatus {
				t.Errorf("status = %d, want %d", ae.Status, tt.wantStatus)
			}
			if ae.Code == nil || *ae.Code != tt.wantCode {
				t.Errorf("code = %v, want %s", ae.Code, tt.wantCode)
			}
			if strings.Contains(ae.Message, "127.0.0.1") {
				t.Errorf("message leaks the upstream address: %q", ae.Message)
			}
		})
	}
}
