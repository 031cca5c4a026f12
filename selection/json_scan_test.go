package selection

import "testing"

// hasControl is a byte loop's answer for every length up to 200 and a
// control byte (or 0x20, 0x7f, 0x80, 0xff: none) at every position.
func TestHasControl(t *testing.T) {
	buf := make([]byte, 200)
	for n := 0; n <= len(buf); n++ {
		for pos := -1; pos < n; pos++ {
			for _, c := range []byte{0x00, 0x01, 0x1f, 0x20, 0x7f, 0x80, 0xff} {
				for i := range buf[:n] {
					buf[i] = 'a' + byte(i%26)
				}
				if pos >= 0 {
					buf[pos] = c
				}
				want := pos >= 0 && c < 0x20
				if got := hasControl(buf[:n]); got != want {
					t.Fatalf("len %d, byte %#x at %d: %v, want %v", n, c, pos, got, want)
				}
			}
		}
	}
}

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
