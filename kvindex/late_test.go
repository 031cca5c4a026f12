package kvindex

import "testing"

// Late.PromptTokens: without a Late the preflight's tokens are the whole
// prompt's; a request routed on a cached message prefix adds its other
// messages' bytes over chars_per_token; a preflight past its timeout
// returned none.
func TestLatePromptTokens(t *testing.T) {
	for _, tt := range []struct {
		name string
		l    *Late
		n    int
		want int
	}{
		{"no late: whole", nil, 500, 500},
		{"routed on a prefix: its tail's 90 bytes", &Late{tail: 90}, 400, 423},
		{"past the timeout", &Late{}, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.l.PromptTokens(tt.n, 4); got != tt.want {
				t.Errorf("PromptTokens(%d) = %d, want %d", tt.n, got, tt.want)
			}
		})
	}
}
