package upstream

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	tests := []struct {
		give, wantDial, wantScheme, wantErr string
	}{
		{give: "a:8000", wantDial: "a:8000", wantScheme: "http"},
		{give: "https://b:9000/", wantDial: "b:9000", wantScheme: "https"},
		{give: "http://a", wantDial: "a:80", wantScheme: "http"},
		{give: "https://a", wantDial: "a:443", wantScheme: "https"},
		{give: "[::1]", wantDial: "[::1]:80", wantScheme: "http"},
		{give: "unix://x", wantErr: "unsupported scheme"},
		{give: "http://a:1/v1", wantErr: "without a path"},
		{give: "a:99999", wantErr: "invalid port"},
		{give: "::1", wantErr: "invalid address"},
		{give: ":80", wantErr: "missing host"},
	}
	for _, tt := range tests {
		u, err := Parse(tt.give)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Parse(%q) error %v, want %q", tt.give, err, tt.wantErr)
			}
			continue
		}
		if err != nil || u.Dial != tt.wantDial || u.Scheme != tt.wantScheme {
			t.Errorf("Parse(%q) = %+v, %v; want %s %s", tt.give, u, err, tt.wantScheme, tt.wantDial)
		}
	}
}

func TestPerEngine(t *testing.T) {
	for _, tt := range []struct {
		give []string
		want []string
		err  bool
	}{
		{nil, []string{"d", "d", "d"}, false},
		{[]string{"x"}, []string{"x", "x", "x"}, false},
		{[]string{"x", "y", "z"}, []string{"x", "y", "z"}, false},
		{[]string{"x", "y"}, nil, true},
	} {
		got, err := PerEngine("n", "value", tt.give, 3, "d")
		if (err != nil) != tt.err || !cmp.Equal(got, tt.want) {
			t.Errorf("PerEngine(%q) = %q, %v", tt.give, got, err)
		}
	}
}

func TestDialsRanks(t *testing.T) {
	addrs := []Addr{{Dial: "a:1", Scheme: "http"}, {Dial: "b:2", Scheme: "https"}}
	dials := Dials(addrs, []int{2, 1})
	if diff := cmp.Diff([]string{"a:1", "a:1", "b:2"}, dials); diff != "" {
		t.Errorf("Dials (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 1, -1}, Ranks(dials)); diff != "" {
		t.Errorf("Ranks (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a:1", "https://b:2"}, BaseURLs(addrs)); diff != "" {
		t.Errorf("BaseURLs (-want +got):\n%s", diff)
	}
	if !UsesTLS(addrs) || UsesTLS(addrs[:1]) {
		t.Error("UsesTLS")
	}
}

func TestAccess(t *testing.T) {
	var a Access
	a.SetDefaults()
	if a.Scheme != "http" || a.Validate("x") != nil {
		t.Fatalf("default %+v: %v", a, a.Validate("x"))
	}
	a.Scheme = "ftp"
	if err := a.Validate("engine_metrics"); err == nil || err.Error() != `engine_metrics: scheme must be http or https, got "ftp"` {
		t.Fatalf("ftp: %v", err)
	}
}
