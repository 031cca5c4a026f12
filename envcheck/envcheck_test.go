package envcheck

import (
	"strings"
	"testing"
)

func TestRetired(t *testing.T) {
	tests := []struct {
		name    string
		give    []string
		wantErr []string
	}{
		{"clean", []string{"RJ_UPSTREAM=a:1", "PATH=/bin", "XMD_FOO=1", "md_lower=1"}, nil},
		{"one", []string{"RJ_UPSTREAM=a:1", "MD_UPSTREAM=a:1"}, []string{"MD_UPSTREAM", "RJ_UPSTREAM"}},
		{"several sorted", []string{"MD_ZETA=", "MD_ALPHA=1"}, []string{"MD_ALPHA (rename it to RJ_ALPHA), MD_ZETA (rename it to RJ_ZETA)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Retired(tt.give)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestCheck(t *testing.T) {
	known := Names([]byte("ramjet {$RJ_UPSTREAM} {\n alpha {$RJ_ALPHA:1}\n upstream_token {env.RJ_UPSTREAM_TOKEN}\n}\n:{$RJ_LISTEN}"))
	for _, n := range []string{"RJ_UPSTREAM", "RJ_ALPHA", "RJ_UPSTREAM_TOKEN", "RJ_LISTEN"} {
		if !known[n] {
			t.Errorf("Names lacks %s", n)
		}
	}
	tests := []struct {
		give    []string
		wantErr string
	}{
		{[]string{"RJ_UPSTREAM=a:1", "RJ_ALPHA=2", "HOME=/"}, ""},
		{[]string{"RJ_ALHPA=2"}, "RJ_ALHPA (did you mean RJ_ALPHA?)"},
		{[]string{"RJ_LISTEN= "}, "RJ_LISTEN is set but empty"},
		{[]string{"MD_ALPHA=2"}, "MD_ALPHA (rename it to RJ_ALPHA)"},
	}
	for _, tt := range tests {
		err := Check(tt.give, known)
		if (err == nil) != (tt.wantErr == "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("Check(%q) = %v, want %q", tt.give, err, tt.wantErr)
		}
	}
	if err := Check([]string{"RJ_WHATEVER=1"}, nil); err != nil {
		t.Errorf("unknown names are not checked without a known list: %v", err)
	}
}
