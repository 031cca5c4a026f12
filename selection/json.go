package selection

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// A small validating JSON scanner over a byte slice. It never allocates on
// the success path: values are returned as spans of the input, strings are
// unescaped on the fly into a sink (the fingerprint), and nothing is
// converted to Go values except the few scalars routing needs.

// maxDepth bounds nesting so that a hostile body cannot exhaust the stack.
const maxDepth = 256

// RequestError is a client error in the request body: malformed JSON or a
// field of the wrong type. Param names the offending top-level field when
// known. The module maps it to an OpenAI-shaped 400.
type RequestError struct {
	Param  string
	Msg    string
	Offset int
}

func (e *RequestError) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("invalid request body: %s (field %q, at byte %d)", e.Msg, e.Param, e.Offset)
	}
	return fmt.Sprintf("invalid request body: %s (at byte %d)", e.Msg, e.Offset)
}

func syntaxErr(off int, msg string) error {
	return &RequestError{Msg: msg, Offset: off}
}

func typeErr(param string, off int, want string) error {
	return &RequestError{Param: param, Msg: "expected " + want, Offset: off}
}

func isWS(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func skipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

// scanString expects b[i] == '"' and returns the index just past the closing
// quote and whether the string contains escapes.
func scanString(b []byte, i int) (end int, escaped bool, err error) {
	start := i + 1
	j := start
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false, syntaxErr(i, "unterminated string")
		}
		q := j + k
		// Count the backslashes right before the quote.
		n := 0
		for p := q - 1; p >= start && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			if hasControl(b[start:q]) {
				return 0, false, syntaxErr(i, "control character in string")
			}
			escaped = bytes.IndexByte(b[start:q], '\\') >= 0
			if escaped && !validEscapes(b[start:q]) {
				return 0, false, syntaxErr(i, "invalid escape in string")
			}
			return q + 1, escaped, nil
		}
		j = q + 1
	}
}

// validEscapes reports whether every backslash in s starts a valid JSON
// escape.
func validEscapes(s []byte) bool {
	for {
		k := bytes.IndexByte(s, '\\')
		if k < 0 {
			return true
		}
		s = s[k:]
		if len(s) < 2 {
			return false
		}
		switch s[1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s = s[2:]
		case 'u':
			if _, ok := hex4(s[2:]); !ok {
				return false
			}
			s = s[6:]
		default:
			return false
		}
	}
}

// hasControl reports whether s holds a byte below 0x20, eight bytes at a
// time (the "has less than" bit trick).
func hasControl(s []byte) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	for len(s) >= 32 {
		a := binary.LittleEndian.Uint64(s)
		b := binary.LittleEndian.Uint64(s[8:])
		c := binary.LittleEndian.Uint64(s[16:])
		d := binary.LittleEndian.Uint64(s[24:])
		if ((a-lo*0x20)&^a|(b-lo*0x20)&^b|(c-lo*0x20)&^c|(d-lo*0x20)&^d)&hi != 0 {
			return true
		}
		s = s[32:]
	}
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		if (x-lo*0x20)&^x&hi != 0 {
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

// scanStringLax is scanString without validation, for a second pass over
// a body the first pass already validated.
func scanStringLax(b []byte, i int) (end int, escaped bool) {
	start := i + 1
	j := start
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return len(b), false
		}
		q := j + k
		n := 0
		for p := q - 1; p >= start && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, bytes.IndexByte(b[start:q], '\\') >= 0
		}
		j = q + 1
	}
}

// skipValue validates and skips one JSON value starting at b[i] (after
// whitespace) and returns the index just past it.
func skipValue(b []byte, i, depth int) (int, error) {
	i = skipWS(b, i)
	if i >= len(b) {
		return 0, syntaxErr(i, "unexpected end of input")
	}
	switch c := b[i]; {
	case c == '"':
		end, _, err := scanString(b, i)
		return end, err
	case c == '{':
		if depth >= maxDepth {
			return 0, syntaxErr(i, "nesting too deep")
		}
		return skipObject(b, i, depth+1)
	case c == '[':
		if depth >= maxDepth {
			return 0, syntaxErr(i, "nesting too deep")
		}
		return skipArray(b, i, depth+1)
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(b, i)
	default:
		return 0, syntaxErr(i, "invalid character "+quoteByte(c))
	}
}

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return "'" + string(rune(c)) + "'"
	}
	return fmt.Sprintf("0x%02x", c)
}

func literal(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, syntaxErr(i, "invalid literal")
	}
	return i + len(lit), nil
}

func scanNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	digits := func() int {
		s := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i - s
	}
	intStart := i
	if n := digits(); n == 0 || (n > 1 && b[intStart] == '0') {
		return 0, syntaxErr(start, "invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return 0, syntaxErr(start, "invalid number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0, syntaxErr(start, "invalid number")
		}
	}
	return i, nil
}

// objectIter walks the members of an object. Usage:
//
//	it := objectIter{b: b, i: start}
//	for it.next() { key := it.key; vstart := it.val; ...; it.skip() or it.at(end) }
//	if it.err != nil { ... }
type objectIter struct {
	b     []byte
	i     int // position: after '{' or after the last value
	depth int
	first bool
	key   []byte // raw key bytes (without quotes; escapes not decoded)
	val   int    // start of the value (whitespace skipped)
	end   int    // index just past the closing '}' once next returns false
	err   error
}

func newObjectIter(b []byte, i, depth int) objectIter {
	// b[i] must be '{'.
	return objectIter{b: b, i: i + 1, depth: depth, first: true}
}

func (it *objectIter) next() bool {
	if it.err != nil {
		return false
	}
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		it.err = syntaxErr(i, "unexpected end of input in object")
		return false
	}
	if b[i] == '}' {
		it.end = i + 1
		return false
	}
	if !it.first {
		if b[i] != ',' {
			it.err = syntaxErr(i, "expected ',' or '}' in object")
			return false
		}
		i = skipWS(b, i+1)
	}
	it.first = false
	if i >= len(b) || b[i] != '"' {
		it.err = syntaxErr(i, "expected string key in object")
		return false
	}
	kend, _, err := scanString(b, i)
	if err != nil {
		it.err = err
		return false
	}
	it.key = b[i+1 : kend-1]
	i = skipWS(b, kend)
	if i >= len(b) || b[i] != ':' {
		it.err = syntaxErr(i, "expected ':' after object key")
		return false
	}
	it.val = skipWS(b, i+1)
	if it.val >= len(b) {
		it.err = syntaxErr(it.val, "unexpected end of input in object")
		return false
	}
	it.i = it.val
	return true
}

// skip skips the current value.
func (it *objectIter) skip() {
	end, err := skipValue(it.b, it.val, it.depth)
	if err != nil {
		it.err = err
		return
	}
	it.i = end
}

func skipObject(b []byte, i, depth int) (int, error) {
	it := newObjectIter(b, i, depth)
	for it.next() {
		it.skip()
	}
	if it.err != nil {
		return 0, it.err
	}
	return it.end, nil
}

// arrayIter walks the elements of an array; same protocol as objectIter.
type arrayIter struct {
	b     []byte
	i     int
	depth int
	first bool
	val   int
	end   int
	err   error
}

func newArrayIter(b []byte, i, depth int) arrayIter {
	return arrayIter{b: b, i: i + 1, depth: depth, first: true}
}

func (it *arrayIter) next() bool {
	if it.err != nil {
		return false
	}
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		it.err = syntaxErr(i, "unexpected end of input in array")
		return false
	}
	if b[i] == ']' {
		it.end = i + 1
		return false
	}
	if !it.first {
		if b[i] != ',' {
			it.err = syntaxErr(i, "expected ',' or ']' in array")
			return false
		}
		i = skipWS(b, i+1)
	}
	it.first = false
	it.val = i
	it.i = i
	return true
}

func (it *arrayIter) skip() {
	end, err := skipValue(it.b, it.val, it.depth)
	if err != nil {
		it.err = err
		return
	}
	it.i = end
}

func skipArray(b []byte, i, depth int) (int, error) {
	it := newArrayIter(b, i, depth)
	for it.next() {
		it.skip()
	}
	if it.err != nil {
		return 0, it.err
	}
	return it.end, nil
}

// unescapeTo decodes the body of a JSON string (without quotes) and writes
// it to the fingerprint in runs, without allocating.
func unescapeTo(s []byte, off int, w *blocker) error {
	var buf [utf8.UTFMax]byte
	for len(s) > 0 {
		k := bytes.IndexByte(s, '\\')
		if k < 0 {
			w.write(s)
			return nil
		}
		if k > 0 {
			w.write(s[:k])
		}
		s = s[k:]
		if len(s) < 2 {
			return syntaxErr(off, "invalid escape")
		}
		var c byte
		switch s[1] {
		case '"', '\\', '/':
			c = s[1]
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		case 'u':
			r, n, ok := decodeU(s)
			if !ok {
				return syntaxErr(off, "invalid \\u escape")
			}
			m := utf8.EncodeRune(buf[:], r)
			w.write(buf[:m])
			s = s[n:]
			continue
		default:
			return syntaxErr(off, "invalid escape")
		}
		buf[0] = c
		w.write(buf[:1])
		s = s[2:]
	}
	return nil
}

func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// decodeU decodes "\uXXXX" (and a following low surrogate) at the start of s.
func decodeU(s []byte) (rune, int, bool) {
	r, ok := hex4(s[2:])
	if !ok {
		return 0, 0, false
	}
	if r >= 0xD800 && r < 0xDC00 {
		if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
			if r2, ok := hex4(s[8:]); ok && r2 >= 0xDC00 && r2 < 0xE000 {
				return (r-0xD800)<<10 | (r2 - 0xDC00) + 0x10000, 12, true
			}
		}
		return utf8.RuneError, 6, true
	}
	if r >= 0xDC00 && r < 0xE000 {
		return utf8.RuneError, 6, true
	}
	return r, 6, true
}
