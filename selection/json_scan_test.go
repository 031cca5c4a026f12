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
