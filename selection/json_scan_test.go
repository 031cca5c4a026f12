package selection

import "testing"

// StringEnd skips a string by the scanner's rules: escapes (an escaped
// quote does not close it), and a string the scanner rejects is not one.
func TestStringEnd(t *testing.T) {
	for _, tc := range []struct {
		in   string
		i    int
		end  int
		want bool
	}{
		{`"ab"`, 0, 4, true},
		{`x"a\"b\\"y`, 1, 9, true},
		{`"a\u0041b",1`, 0, 10, true},
		{`"open`, 0, 0, false},
		{"\"a\nb\"", 0, 0, false}, // a raw control character
		{`"a\qb"`, 0, 0, false},   // an invalid escape
		{`ab`, 0, 0, false},       // not at a quote
		{`"a"`, 3, 0, false},      // past the end
	} {
		end, ok := StringEnd([]byte(tc.in), tc.i)
		if ok != tc.want || ok && end != tc.end {
			t.Errorf("StringEnd(%q, %d) = %d, %v; want %d, %v", tc.in, tc.i, end, ok, tc.end, tc.want)
		}
	}
}
