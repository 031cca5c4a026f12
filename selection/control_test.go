package selection

import (
	"math/rand/v2"
	"testing"
)

// stringRunRef is stringRun a byte at a time.
func stringRunRef(s []byte) (int, bool) {
	esc := false
	for j := 0; j < len(s); j++ {
		c := s[j]
		if c == '"' || c < 0x20 {
			return j, esc
		}
		if c != '\\' {
			continue
		}
		if j+1 >= len(s) {
			return j, esc
		}
		switch s[j+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			esc = true
			j++
		default:
			return j, esc
		}
	}
	return len(s), esc
}

// TestStringRun checks stringRun (vector steps on amd64) and
// stringRunSWAR against a byte loop: every length to 200 at four offsets,
// special bytes (a quote, a control byte, a backslash starting an escape
// that is stepped over or one that is not) at every position and random
// ones after it, with the bytes around them (0x20, 0x21, 0x5b, 0x5d, high
// bytes) that are not special.
// TestStringRun checks stringRun against stringRunRef with each of its
// paths (AVX2 where the CPU has it, SSE2).
func TestStringRun(t *testing.T) {
	saved := useAVX2
	defer func() { useAVX2 = saved }()
	for _, avx := range []bool{false, true} {
		if avx && !saved {
			continue
		}
		useAVX2 = avx
		t.Run(map[bool]string{false: "sse2", true: "avx2"}[avx], testStringRun)
	}
}

func testStringRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 320)
	fill := func() {
		for i := range buf {
			switch rng.IntN(5) {
			case 0:
				buf[i] = []byte{0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 'n', 'u', 't'}[rng.IntN(9)]
			case 1:
				buf[i] = byte(0x80 + rng.IntN(0x80))
			default:
				buf[i] = byte(0x23 + rng.IntN(0x39)) // '#' to '[': no quote, no backslash
			}
		}
	}
	check := func(s []byte) {
		t.Helper()
		wk, we := stringRunRef(s)
		if k, e := stringRunSWAR(s); k != wk || e != we {
			t.Fatalf("stringRunSWAR(%q) = %d, %v; want %d, %v", s, k, e, wk, we)
		}
		if len(s) >= 16 {
			if k, e := stringRun(s); k != wk || e != we {
				t.Fatalf("stringRun(%q) = %d, %v; want %d, %v", s, k, e, wk, we)
			}
		}
	}
	specials := [][]byte{{'"'}, {0x00}, {0x0a}, {0x1f}, {'\\', 'n'}, {'\\', '"'}, {'\\', '\\'}, {'\\', '/'},
		{'\\', 'u'}, {'\\', 'x'}, {'\\', 0x01}, {'\\'}}
	clean := make([]byte, len(buf))
	for off := range 4 {
		for n := 0; off+n <= 200; n++ {
			fill()
			copy(clean, buf)
			s := buf[off : off+n]
			check(s)
			for p := 0; p < n; p++ {
				for range 4 {
					copy(s[p:], specials[rng.IntN(len(specials))])
					for q := rng.IntN(4); q > 0; q-- {
						copy(s[p+rng.IntN(n-p):], specials[rng.IntN(len(specials))])
					}
					check(s)
					copy(buf, clean)
				}
			}
		}
	}
}

// BenchmarkStringRun measures the search for a string's next special
// byte over a long string without one (the 256 KiB prompt's scan), and
// over the agent body's system prompt (a \n escape every 86 bytes),
// vector steps against plain Go.
func BenchmarkStringRun(b *testing.B) {
	s := []byte(oneStringBody(256 << 10))
	s = s[len(`{"model":"qwen3-32b","messages":[{"role":"user","content":"`):]
	s = s[:len(s)-len(`"}],"max_tokens":64}`)]
	line := `Rule: keep functions small, test every change, and explain what you did in one line.\n`
	var e []byte
	for len(e) < 16<<10 {
		e = append(e, line...)
	}
	for _, in := range []struct {
		name string
		s    []byte
	}{{"plain", s}, {"escapes", e}} {
		for _, tt := range []struct {
			name string
			f    func([]byte) (int, bool)
		}{{"stringRun", stringRun}, {"swar", stringRunSWAR}} {
			b.Run(in.name+"/"+tt.name, func(b *testing.B) {
				b.SetBytes(int64(len(in.s)))
				for b.Loop() {
					if k, _ := tt.f(in.s); k != len(in.s) {
						b.Fatal("special byte in the prompt")
					}
				}
			})
		}
	}
}
