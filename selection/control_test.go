package selection

import (
	"math/rand/v2"
	"testing"
)

// TestHasControlMatchesSWAR checks hasControl (vector blocks on amd64)
// against the plain-Go check: every length to 300 at every offset, a
// control byte at every position, the bytes around 0x20 and high bytes.
func TestHasControlMatchesSWAR(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 320)
	fill := func() {
		for i := range buf {
			// Printable, high (UTF-8) and the edge 0x20: never control.
			switch rng.IntN(4) {
			case 0:
				buf[i] = 0x20
			case 1:
				buf[i] = byte(0x80 + rng.IntN(0x80))
			default:
				buf[i] = byte(0x21 + rng.IntN(0x5f))
			}
		}
	}
	for off := range 8 {
		for n := 0; off+n <= 300; n++ {
			fill()
			s := buf[off : off+n]
			if hasControl(s) || hasControlSWAR(s) {
				t.Fatalf("off %d len %d: control found in clean bytes", off, n)
			}
			for p := 0; p < n; p++ {
				for _, c := range []byte{0x00, 0x09, 0x0a, 0x1f} {
					old := s[p]
					s[p] = c
					if !hasControl(s) || !hasControlSWAR(s) {
						t.Fatalf("off %d len %d: control byte %#x at %d missed", off, n, c, p)
					}
					s[p] = old
				}
			}
		}
	}
}

// BenchmarkHasControl measures the control-character check over a long
// string without one (the 256 KiB prompt's scan), vector blocks against
// plain Go.
func BenchmarkHasControl(b *testing.B) {
	s := []byte(oneStringBody(256 << 10))
	s = s[len(`{"model":"qwen3-32b","messages":[{"role":"user","content":"`):]
	s = s[:len(s)-len(`"}],"max_tokens":64}`)]
	for _, tt := range []struct {
		name string
		f    func([]byte) bool
	}{{"hasControl", hasControl}, {"swar", hasControlSWAR}} {
		b.Run(tt.name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				if tt.f(s) {
					b.Fatal("control byte in the prompt")
				}
			}
		})
	}
}
