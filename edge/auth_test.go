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

// refSet is UpstreamAuth.Set as it was before SetKnown: every credential
// header deleted that the token or no forwarding drops, present or not.
func refSet(a UpstreamAuth, h http.Header) {
	switch {
	case a.bearer != "":
		h["Authorization"] = []string{a.bearer}
		delete(h, "Api-Key")
		delete(h, "X-Api-Key")
	case !a.forward:
		delete(h, "Authorization")
		delete(h, "Api-Key")
		delete(h, "X-Api-Key")
	}
}

// TestSetKnownMatchesSet: StripRequestHeaders then SetKnown with the
// credentials it reported leaves every header as StripRequestHeaders then
// Set (refSet: its deletes unconditional) does, for every subset of the credential headers (one of them also
// named in Connection, which strips it first), with and without a token
// and forwarding; and the report is the set of those left.
func TestSetKnownMatchesSet(t *testing.T) {
	names := []string{"Authorization", "Api-Key", "X-Api-Key", "Proxy-Authorization"}
	for mask := range 1 << (len(names) + 1) {
		client := func() http.Header {
			h := http.Header{"Accept": {"*/*"}, "X-Ramjet-Upstream": {"forged"}}
			for i, n := range names {
				if mask&(1<<i) != 0 {
					h[n] = []string{"v" + n}
				}
			}
			if mask&(1<<len(names)) != 0 {
				h["Connection"] = []string{"keep-alive, api-key"}
			}
			return h
		}
		for _, a := range []UpstreamAuth{NewUpstreamAuth("t", false), NewUpstreamAuth("t", true), NewUpstreamAuth("", true), NewUpstreamAuth("", false)} {
			want := client()
			StripRequestHeaders(want)
			left := Creds(0)
			for n := range want {
				switch n {
				case "Authorization":
					left |= CredAuthorization
				case "Api-Key":
					left |= CredAPIKey
				case "X-Api-Key":
					left |= CredXAPIKey
				}
			}
			refSet(a, want)
			got := client()
			creds, _ := StripRequestHeaders(got)
			if creds != left {
				t.Errorf("mask %b: StripRequestHeaders reported %b, credential headers left %b", mask, creds, left)
			}
			a.SetKnown(got, creds)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("mask %b, %+v: SetKnown (-Set +SetKnown):\n%s", mask, a, diff)
			}
			set := client()
			StripRequestHeaders(set)
			a.Set(set)
			if diff := cmp.Diff(want, set); diff != "" {
				t.Errorf("mask %b, %+v: Set (-want +got):\n%s", mask, a, diff)
			}
		}
	}
}
