package selection

import (
	"math/rand/v2"
	"testing"
)

// TestSpecialIndex checks specialIndex (vector steps on amd64) and
// specialIndexSWAR against a byte loop: every length to 300 at every
// offset, one special byte (a quote, a backslash, a control byte) at
// every position and a second one after it, with the bytes around them
// (0x20, 0x21, 0x5b, 0x5d, high bytes) that are not special.
func TestSpecialIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 320)
	fill := func() {
		for i := range buf {
			switch rng.IntN(5) {
			case 0:
				buf[i] = []byte{0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f}[rng.IntN(6)]
			case 1:
				buf[i] = byte(0x80 + rng.IntN(0x80))
			default:
				buf[i] = byte(0x23 + rng.IntN(0x39)) // '#' to '[': no quote, no backslash
			}
		}
	}
	check := func(s []byte, want int) {
		t.Helper()
		if got := specialIndexSWAR(s); got != want {
			t.Fatalf("specialIndexSWAR(%q) = %d, want %d", s, got, want)
		}
		if len(s) >= 16 {
			if got := specialIndex(s); got != want {
				t.Fatalf("specialIndex(%q) = %d, want %d", s, got, want)
			}
		}
	}
	for off := range 8 {
		for n := 0; off+n <= 300; n++ {
			fill()
			s := buf[off : off+n]
			check(s, n)
			for p := 0; p < n; p++ {
				for _, c := range []byte{'"', '\\', 0x00, 0x0a, 0x1f} {
					old := s[p]
					s[p] = c
					q := p + 1 + rng.IntN(n-p)
					var old2 byte
					if q < n {
						old2 = s[q]
						s[q] = '"'
					}
					check(s, p)
					if q < n {
						s[q] = old2
					}
					s[p] = old
				}
			}
		}
	}
}

// BenchmarkSpecialIndex measures the search for a string's next special
// byte over a long string without one (the 256 KiB prompt's scan),
// vector steps against plain Go.
func BenchmarkSpecialIndex(b *testing.B) {
	s := []byte(oneStringBody(256 << 10))
	s = s[len(`{"model":"qwen3-32b","messages":[{"role":"user","content":"`):]
	s = s[:len(s)-len(`"}],"max_tokens":64}`)]
	for _, tt := range []struct {
		name string
		f    func([]byte) int
	}{{"specialIndex", specialIndex}, {"swar", specialIndexSWAR}} {
		b.Run(tt.name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				if tt.f(s) != len(s) {
					b.Fatal("special byte in the prompt")
				}
			}
		})
	}
}
