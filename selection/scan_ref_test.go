package selection

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// scanStringRef is scanString as it was on main b39feb6 (bytes.IndexByte
// for the quote and the backslashes, then a check of the runs for control
// characters), the reference TestScanStringMatchesRef holds the one-pass
// scanner to. It validates the string starting at b[i] == '"' and returns the
// index just past its closing quote and whether it contains escapes. It
// runs over the string with bytes.IndexByte (vectorised) for the quote and
// the backslashes and checks the runs between escapes for control
// characters eight bytes at a time (hasControl).
func scanStringRef(b []byte, i int) (end int, escaped bool, err error) {
	j := i + 1
	// Short strings (keys, roles, short texts) end within a few words:
	// look at them a word at a time before paying for bytes.IndexByte's
	// setup.
	for n := 0; n < shortWords && j+8 <= len(b); n++ {
		if m := special(binary.LittleEndian.Uint64(b[j:])); m != 0 {
			j += bits.TrailingZeros64(m) >> 3
			if b[j] == '"' {
				return j + 1, false, nil
			}
			break
		}
		j += 8
	}
	q := -1 // the next quote at or after j, once found
	for {
		if q < j {
			k := bytes.IndexByte(b[j:], '"')
			if k < 0 {
				return 0, false, syntaxErr(i, "unterminated string")
			}
			q = j + k
		}
		k := bytes.IndexByte(b[j:q], '\\')
		if k < 0 {
			if hasControlRef(b[j:q]) {
				return 0, false, controlErrRef(b, j)
			}
			return q + 1, escaped, nil
		}
		p := j + k
		if hasControlRef(b[j:p]) {
			return 0, false, controlErrRef(b, j)
		}
		escaped = true
		if p+1 >= len(b) {
			return 0, false, syntaxErr(i, "unterminated string")
		}
		switch b[p+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			j = p + 2
		case 'u':
			if _, ok := hex4(b[p+2:]); !ok {
				return 0, false, syntaxErr(p, "invalid \\u escape in string")
			}
			j = p + 6
		default:
			return 0, false, syntaxErr(p, "invalid escape "+quoteByte(b[p+1])+" in string")
		}
	}
}

func controlErrRef(b []byte, j int) error {
	for b[j] >= 0x20 {
		j++
	}
	return syntaxErr(j, "control character "+quoteByte(b[j])+" in string")
}

// hasControlSWAR is hasControl in plain Go, 64 bytes at a time (the "has
// less than" bit trick: exact for "any"; eight words per test keep the
// loop's one branch off the critical path).
func hasControlRef(s []byte) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	const k = lo * 0x20
	for len(s) >= 64 {
		_ = s[63]
		a := binary.LittleEndian.Uint64(s)
		b := binary.LittleEndian.Uint64(s[8:])
		c := binary.LittleEndian.Uint64(s[16:])
		d := binary.LittleEndian.Uint64(s[24:])
		e := binary.LittleEndian.Uint64(s[32:])
		f := binary.LittleEndian.Uint64(s[40:])
		g := binary.LittleEndian.Uint64(s[48:])
		h := binary.LittleEndian.Uint64(s[56:])
		if ((a-k)&^a|(b-k)&^b|(c-k)&^c|(d-k)&^d|(e-k)&^e|(f-k)&^f|(g-k)&^g|(h-k)&^h)&hi != 0 {
			return true
		}
		s = s[64:]
	}
	if len(s) >= 32 {
		a := binary.LittleEndian.Uint64(s)
		b := binary.LittleEndian.Uint64(s[8:])
		c := binary.LittleEndian.Uint64(s[16:])
		d := binary.LittleEndian.Uint64(s[24:])
		if ((a-k)&^a|(b-k)&^b|(c-k)&^c|(d-k)&^d)&hi != 0 {
			return true
		}
		s = s[32:]
	}
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		if (x-k)&^x&hi != 0 {
			return true
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// TestScanStringMatchesRef holds scanString to scanStringRef (the scanner
// before it): the same end, escaped flag and error (message and offset)
// on random strings built from the bytes that matter (quotes,
// backslashes, escape letters, hex digits, control bytes) around runs of
// every length, with and without a closing quote, and on every prefix.
func TestScanStringMatchesRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pieces := []string{`"`, `\\`, `\"`, `\\`, `\n`, `\u`, `\u00e9`, `\ud83d\ude00`, `\x`, `\u12`, "\x01", "\x1f", "\t",
		"\x7f", "\xff", " ", "a", "0", "F", "u", "/", strings.Repeat("abcdefgh", 3), strings.Repeat("x", 70)}
	for n := 0; n < 200000; n++ {
		var sb strings.Builder
		sb.WriteString(`"`)
		for k := rng.IntN(12); k > 0; k-- {
			p := pieces[rng.IntN(len(pieces))]
			if rng.IntN(3) == 0 {
				p = strings.Repeat("q", rng.IntN(40))
			}
			sb.WriteString(p)
		}
		if rng.IntN(4) != 0 {
			sb.WriteString(`"`)
		}
		if rng.IntN(2) == 0 {
			sb.WriteString(`,"next":"v"}`)
		}
		b := []byte(sb.String())
		for _, c := range []int{len(b), rng.IntN(len(b) + 1)} {
			s := b[:c]
			if len(s) == 0 {
				continue
			}
			e1, x1, err1 := scanString(s, 0)
			e2, x2, err2 := scanStringRef(s, 0)
			if e1 != e2 || x1 != x2 || !reflect.DeepEqual(err1, err2) {
				t.Fatalf("scanString(%q) = %d, %v, %v; the reference %d, %v, %v", s, e1, x1, err1, e2, x2, err2)
			}
		}
	}
}
