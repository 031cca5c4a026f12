package edge

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestUpstreamAuth: the token replaces every client credential; without
// one the client's are forwarded when asked, else dropped; other headers
// stay.
func TestUpstreamAuth(t *testing.T) {
	client := func() http.Header {
		return http.Header{"Authorization": {"Bearer client"}, "Api-Key": {"k1"}, "X-Api-Key": {"k2"}, "Accept": {"*/*"}}
	}
	tests := []struct {
		name    string
		token   string
		forward bool
		want    http.Header
	}{
		{name: "token", token: "t", want: http.Header{"Authorization": {"Bearer t"}, "Accept": {"*/*"}}},
		{name: "token over forward", token: "t", forward: true, want: http.Header{"Authorization": {"Bearer t"}, "Accept": {"*/*"}}},
		{name: "forward", forward: true, want: client()},
		{name: "none", want: http.Header{"Accept": {"*/*"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewUpstreamAuth(tt.token, tt.forward)
			h := client()
			a.Set(h)
			if diff := cmp.Diff(tt.want, h); diff != "" {
				t.Errorf("Set (-want +got):\n%s", diff)
			}
		})
	}
	h := client()
	NewUpstreamAuth("t", false).Set(h)
	h["Authorization"][0] = "changed" // a later handler editing the value in place
	h = client()
	NewUpstreamAuth("t", false).Set(h)
	if got := h.Get("Authorization"); got != "Bearer t" {
		t.Fatalf("Authorization %q after an earlier request's value was edited in place", got)
	}
}
