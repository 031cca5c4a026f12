package module

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/google/go-cmp/cmp"
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

func TestWriteAPIError(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Encoding", "gzip")
	WriteAPIError(rec, newAPIError(http.StatusNotFound, errTypeInvalidRequest, errCodeModelNotFound, "model", "The model `x` does not exist."))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("status = %d, want 404", rec.Code)
	}
	if got := rec.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := rec.Header().Get("Content-Encoding"); got != "" {
		t.Errorf("Content-Encoding kept: %q", got)
	}
	want := `{"error":{"message":"The model ` + "`x`" + ` does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}}` + "\n"
	if diff := cmp.Diff(want, rec.Body.String()); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	decodeWireError(t, rec.Body.Bytes())
}

func TestAPIErrorFromHandler(t *testing.T) {
	leak := errors.New("dial tcp 127.0.0.1:8123: connect: connection refused")
	tests := []struct {
		name       string
		give       error
		wantStatus int
		wantCode   string
	}{
		{"no upstream", caddyhttp.Error(http.StatusServiceUnavailable, errors.New("no upstreams available")), 503, errCodeNoReplica},
		{"dial failure", caddyhttp.Error(http.StatusBadGateway, leak), 502, errCodeUpstreamFailed},
		{"timeout", caddyhttp.Error(http.StatusGatewayTimeout, leak), 504, errCodeUpstreamTimeout},
		{"too large", caddyhttp.Error(http.StatusRequestEntityTooLarge, leak), 413, errCodeBodyTooLarge},
		{"plain error", leak, 500, errCodeInternal},
		{"client gone", caddyhttp.Error(499, leak), 499, "client_closed_request"},
		{"wrapped api error", fmt.Errorf("x: %w", newAPIError(404, errTypeInvalidRequest, errCodeModelNotFound, "model", "m")), 404, errCodeModelNotFound},
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
