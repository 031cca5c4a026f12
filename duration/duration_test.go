package duration

import (
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestLikeCaddy checks that Duration decodes and encodes every input as
// caddy.Duration does, errors included.
func TestLikeCaddy(t *testing.T) {
	for _, in := range []string{`"1.5s"`, `"2d"`, `"1d12h"`, `"-3m"`, `"0.5d"`, `1000000`, `0`, `"soon"`, `"d"`,
		`""`, `true`, `"1x"`, `-7`} {
		var got Duration
		var want caddy.Duration
		gerr := json.Unmarshal([]byte(`{"d":`+in+`}`), &struct {
			D *Duration `json:"d"`
		}{&got})
		werr := json.Unmarshal([]byte(`{"d":`+in+`}`), &struct {
			D *caddy.Duration `json:"d"`
		}{&want})
		if (gerr == nil) != (werr == nil) || int64(got) != int64(want) {
			t.Errorf("%s: got %d (%v), caddy %d (%v)", in, got, gerr, want, werr)
		}
		if gerr != nil {
			continue
		}
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		if string(gb) != string(wb) {
			t.Errorf("%s: marshals as %s, caddy as %s", in, gb, wb)
		}
	}
	for _, s := range []string{"1d", "1.5d2h", "3h", "bad", "", "+1d"} {
		got, gerr := Parse(s)
		want, werr := caddy.ParseDuration(s)
		if got != want || (gerr == nil) != (werr == nil) {
			t.Errorf("Parse(%q) = %v, %v; caddy %v, %v", s, got, gerr, want, werr)
		}
	}
}
