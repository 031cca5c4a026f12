package kvindex

import "testing"

// Late.PromptTokens: without a Late the preflight's tokens are the whole
// prompt's; a request routed on a cached message prefix adds its other
// messages' bytes over chars_per_token; a preflight past its timeout
// covers nothing.
func TestLatePromptTokens(t *testing.T) {
	for _, tt := range []struct {
		name      string
		l         *Late
		n         int
		want      int
		wantWhole bool
	}{
		{"no late: whole", nil, 500, 500, true},
		{"routed on a prefix: its tail's 90 bytes", &Late{tail: 90}, 400, 423, true},
		{"past the timeout", &Late{}, 0, 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got, whole := tt.l.PromptTokens(tt.n, 4); got != tt.want || whole != tt.wantWhole {
				t.Errorf("PromptTokens(%d) = %d, %v; want %d, %v", tt.n, got, whole, tt.want, tt.wantWhole)
			}
		})
	}
}
