package selection

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf8"
)

// This file is ramjet's only JSON scanner (Extractor.Parse in features.go
// drives it). It works over a byte slice and never allocates on the success
// path: values are returned as spans of the input, strings are decoded on
// the fly into a sink (the fingerprint), and nothing is converted to Go
// values except the few scalars routing needs.
//
// It accepts exactly what encoding/json accepts (RFC 8259: no trailing
// commas, no comments, no leading zeros, no control characters in strings;
// invalid UTF-8 is accepted, as encoding/json does), with the same nesting
// limit, MaxDepth. The differential fuzzers in fuzz_test.go hold it to that.

// MaxDepth is the deepest nesting of objects and arrays a request body may
// have: 10000, the limit of encoding/json, so that the set of accepted
// bodies is exactly encoding/json's. The scanner is iterative, so the limit
// costs no stack: a deeper body is refused with a *RequestError ("nesting
// too deep"), never parsed partially.
const MaxDepth = 10000

// RequestError is a client error in the request body: malformed JSON
// (Syntax), or valid JSON with a field of the wrong type. Param names the
// offending field when known: a top-level field ("messages"), or a path
// into it in OpenAI's style ("messages.[2].content"). The module answers it
// with an OpenAI-shaped 400.
type RequestError struct {
	Param  string
	Msg    string
	Offset int
	// Syntax reports malformed JSON, which encoding/json rejects too; false
	// for well-formed JSON that is not a request ramjet can read.
	Syntax bool
}

func (e *RequestError) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("invalid request body: %s (field %q, at byte %d)", e.Msg, e.Param, e.Offset)
	}
	return fmt.Sprintf("invalid request body: %s (at byte %d)", e.Msg, e.Offset)
}

func syntaxErr(off int, msg string) error {
	return &RequestError{Msg: msg, Offset: off, Syntax: true}
}

func typeErr(param string, off int, want string) error {
	return &RequestError{Param: param, Msg: param + " must be " + want, Offset: off}
}

// inField names the top-level field a syntax error occurred in.
func inField(err error, param string) error {
	if re, ok := err.(*RequestError); ok && re.Param == "" {
		re.Param = param
	}
	return err
}

// wsBits has the bits of the four whitespace bytes set.
const wsBits uint64 = 1<<' ' | 1<<'\n' | 1<<'\r' | 1<<'\t'

// isWS reports JSON whitespace in one test of a bit mask (c is at most
// ' ' first: a compact body's next byte fails there).
func isWS(c byte) bool { return c <= ' ' && wsBits>>c&1 != 0 }

func skipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special returns a mask whose lowest set bit is the high bit of the first
// byte of x (little endian) that is '"', '\\' or a control character; 0
// when there is none. Each of the three "has zero byte" terms is exact at
// its lowest set bit, so their union is exact there too.
func special(x uint64) uint64 {
	q := x ^ (lsb * '"')
	s := x ^ (lsb * '\\')
	return ((q-lsb)&^q | (s-lsb)&^s | (x-lsb*0x20)&^x) & msb
}

// quoteOrBackslash is special without the control characters, for a body
// already validated.
func quoteOrBackslash(x uint64) uint64 {
	q := x ^ (lsb * '"')
	s := x ^ (lsb * '\\')
	return ((q-lsb)&^q | (s-lsb)&^s) & msb
}

// shortWords is how many words of a string laxString reads a word at a
// time before it switches to bytes.IndexByte.
const shortWords = 4

// scanWords is how many words of a string (and of each run after an
// escape) scanString reads a word at a time before stringRun.
const scanWords = 2

// StringEnd returns the index just past the closing quote of the JSON
// string that starts at b[i] == '"', validated as the parse validates
// strings; false when it is not a valid string. For the walkers over
// bytes Parse or IntFieldSet already decided (kvindex's message split,
// usage's answer layouts), so that a string is skipped by this scanner's
// rules, not by a copy of them.
func StringEnd(b []byte, i int) (end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	end, _, err := scanString(b, i)
	return end, err == nil
}

// scanString validates the string starting at b[i] == '"' and returns the
// index just past its closing quote and whether it contains escapes. It
// walks the string once, stopping only at the bytes that matter (a quote,
// a backslash, a control character): a word at a time for the first few
// words (keys, roles, short texts), then 32 bytes at a time (stringRun,
// which also steps over the two-byte escapes itself).
func scanString(b []byte, i int) (end int, escaped bool, err error) {
	j := i + 1
	for {
		// j is where the next special byte is looked for.
		k := -1
		for n := 0; n < scanWords && j+8 <= len(b); n++ {
			if m := special(binary.LittleEndian.Uint64(b[j:])); m != 0 {
				k = j + bits.TrailingZeros64(m)>>3
				break
			}
			j += 8
		}
		if k < 0 {
			var esc bool
			if len(b)-j >= 16 {
				k, esc = stringRun(b[j:])
			} else {
				k, esc = stringRunSWAR(b[j:])
			}
			k += j
			escaped = escaped || esc
			if k >= len(b) {
				return 0, false, syntaxErr(i, "unterminated string")
			}
		}
		switch c := b[k]; {
		case c == '"':
			return k + 1, escaped, nil
		case c < 0x20:
			return 0, false, stringErr(b, i, k, syntaxErr(k, "control character "+quoteByte(c)+" in string"))
		}
		// A backslash.
		escaped = true
		if k+1 >= len(b) {
			return 0, false, syntaxErr(i, "unterminated string")
		}
		switch b[k+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			j = k + 2
		case 'u':
			if _, ok := hex4(b[k+2:]); !ok {
				return 0, false, stringErr(b, i, k, syntaxErr(k, "invalid \\u escape in string"))
			}
			j = k + 6
		default:
			return 0, false, stringErr(b, i, k, syntaxErr(k, "invalid escape "+quoteByte(b[k+1])+" in string"))
		}
	}
}

// stringErr is err, found at b[k] in the string that starts at b[i],
// unless no quote follows k: then the string is unterminated, which is
// reported first (as a scanner that looks for the closing quote before
// it reads what precedes it does).
func stringErr(b []byte, i, k int, err error) error {
	if bytes.IndexByte(b[k+1:], '"') < 0 {
		return syntaxErr(i, "unterminated string")
	}
	return err
}

// stringRunSWAR is stringRun a word at a time, for any length.
func stringRunSWAR(s []byte) (k int, esc bool) {
	j := 0
	for {
		for ; j+8 <= len(s); j += 8 {
			if m := special(binary.LittleEndian.Uint64(s[j:])); m != 0 {
				j += bits.TrailingZeros64(m) >> 3
				goto found
			}
		}
		for ; j < len(s); j++ {
			if c := s[j]; c == '"' || c == '\\' || c < 0x20 {
				goto found
			}
		}
		return len(s), esc
	found:
		if s[j] != '\\' || j+1 >= len(s) {
			return j, esc
		}
		switch s[j+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			esc = true
			j += 2
		default:
			return j, esc
		}
	}
}

// laxString is scanString for a body already validated: it finds the
// closing quote with bytes.IndexByte and counts the backslashes before it.
func laxString(b []byte, i int) (end int, escaped bool) {
	start := i + 1
	j := start
	for n := 0; n < shortWords && j+8 <= len(b); n++ {
		if m := quoteOrBackslash(binary.LittleEndian.Uint64(b[j:])); m != 0 {
			if q := j + bits.TrailingZeros64(m)>>3; b[q] == '"' {
				return q + 1, false
			}
			break
		}
		j += 8
	}
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
			return q + 1, escaped || bytes.IndexByte(b[j:q], '\\') >= 0
		}
		escaped = true
		j = q + 1
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

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func scanNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	j := digits(b, i)
	if j == i || (j-i > 1 && b[i] == '0') {
		return 0, syntaxErr(start, "invalid number")
	}
	i = j
	if i < len(b) && b[i] == '.' {
		if j = digits(b, i+1); j == i+1 {
			return 0, syntaxErr(start, "invalid number")
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if j = digits(b, i); j == i {
			return 0, syntaxErr(start, "invalid number")
		}
		i = j
	}
	return i, nil
}

// scanScalar validates the string, number or literal at b[i].
func scanScalar(b []byte, i int) (int, error) {
	switch c := b[i]; {
	case c == '"':
		end, _, err := scanString(b, i)
		return end, err
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(b, i)
	}
	return 0, syntaxErr(i, "invalid character "+quoteByte(b[i])+" looking for the beginning of a value")
}

// skipValue validates one JSON value at b[i] (whitespace before it is
// skipped) and returns the index just past it. depth is the number of
// containers the value is nested in. It is iterative: nesting costs one
// bit per level, on the stack up to 256 levels and in one allocation
// beyond (a legitimate request body never nests that deep).
func skipValue(b []byte, i, depth int) (int, error) {
	i = skipWS(b, i)
	if i >= len(b) {
		return 0, syntaxErr(i, "unexpected end of input")
	}
	if c := b[i]; c != '{' && c != '[' {
		return scanScalar(b, i)
	}
	var small [4]uint64
	stack := small[:] // bit n set: level n is an object
	top := 0          // open containers in this call
	for {
		// At the start of a value.
		switch c := b[i]; c {
		case '{', '[':
			if depth+top >= MaxDepth {
				return 0, syntaxErr(i, "nesting too deep (the limit is 10000)")
			}
			if top>>6 >= len(stack) {
				stack = append(make([]uint64, 0, (MaxDepth+63)/64), stack...)[:(MaxDepth+63)/64]
			}
			w, m := top>>6, uint64(1)<<(top&63)
			if c == '{' {
				stack[w] |= m
			} else {
				stack[w] &^= m
			}
			top++
			i = skipWS(b, i+1)
			if i >= len(b) {
				return 0, syntaxErr(i, "unexpected end of input")
			}
			if c == '{' {
				if b[i] == '}' {
					i++
					top--
					break
				}
				var err error
				if i, err = objectKey(b, i); err != nil {
					return 0, err
				}
				continue
			}
			if b[i] == ']' {
				i++
				top--
				break
			}
			continue
		default:
			var err error
			if i, err = scanScalar(b, i); err != nil {
				return 0, err
			}
		}
		// After a value: close containers until one wants another value.
		for {
			if top == 0 {
				return i, nil
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return 0, syntaxErr(i, "unexpected end of input")
			}
			obj := stack[(top-1)>>6]&(1<<((top-1)&63)) != 0
			c := b[i]
			if c == ',' {
				i = skipWS(b, i+1)
				if obj {
					var err error
					if i, err = objectKey(b, i); err != nil {
						return 0, err
					}
				} else if i >= len(b) {
					return 0, syntaxErr(i, "unexpected end of input")
				}
				break
			}
			if obj && c == '}' || !obj && c == ']' {
				i++
				top--
				continue
			}
			if obj {
				return 0, syntaxErr(i, "expected ',' or '}' after object member")
			}
			return 0, syntaxErr(i, "expected ',' or ']' after array element")
		}
	}
}

// objectKey validates `"key" :` at b[i] and returns the start of the value
// (whitespace skipped).
func objectKey(b []byte, i int) (int, error) {
	if i >= len(b) || b[i] != '"' {
		if i >= len(b) {
			return 0, syntaxErr(i, "unexpected end of input")
		}
		return 0, syntaxErr(i, "expected a string key in object")
	}
	end, _, err := scanString(b, i)
	if err != nil {
		return 0, err
	}
	i = skipWS(b, end)
	if i >= len(b) || b[i] != ':' {
		return 0, syntaxErr(i, "expected ':' after object key")
	}
	i = skipWS(b, i+1)
	if i >= len(b) {
		return 0, syntaxErr(i, "unexpected end of input")
	}
	return i, nil
}

// objectIter walks the members of an object, validating its syntax (the
// member values are the caller's to consume). Usage:
//
//	it := newObjectIter(b, start, depth)
//	for it.next() { key := decodeKey(it.key, it.esc, &buf); v := it.val; ...; it.i = end of the value }
//	if it.err != nil { ... }
type objectIter struct {
	b     []byte
	i     int // position: after '{' or after the last value
	depth int // nesting depth of the object's members
	first bool
	key   []byte // the raw key (without quotes); see decodeKey
	esc   bool   // the key has escapes
	val   int    // start of the value (whitespace skipped)
	end   int    // index just past the closing '}' once next returns false
	err   error
}

// keyWords is how many words of a key objectIter.next reads itself before
// it leaves the key to scanString.
const keyWords = 3

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
			it.err = syntaxErr(i, "expected ',' or '}' after object member")
			return false
		}
		i = skipWS(b, i+1)
	}
	it.first = false
	if i >= len(b) || b[i] != '"' {
		it.err = syntaxErr(i, "expected a string key in object")
		return false
	}
	// A key that ends within keyWords words is read here (the usage
	// object's keys run to 21 bytes); scanString would read the same
	// words first.
	var kend int
	var esc bool
	for j := i + 1; j+8 <= len(b) && j < i+1+8*keyWords; j += 8 {
		if m := special(binary.LittleEndian.Uint64(b[j:])); m != 0 {
			if q := j + bits.TrailingZeros64(m)>>3; b[q] == '"' {
				kend = q + 1
			}
			break
		}
	}
	if kend == 0 {
		var err error
		if kend, esc, err = scanString(b, i); err != nil {
			it.err = err
			return false
		}
	}
	it.key, it.esc = b[i+1:kend-1], esc
	if kend+1 < len(b) && b[kend] == ':' && b[kend+1] > ' ' {
		// Compact JSON: the value right after the colon.
		it.val, it.i = kend+1, kend+1
		return true
	}
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

// restart makes it walk the object at b[i] == '{' at the same depth (it
// must not have failed).
func (it *objectIter) restart(i int) {
	it.i, it.first = i+1, true
}

// skip validates and skips the current value.
func (it *objectIter) skip() {
	end, err := skipValue(it.b, it.val, it.depth)
	if err != nil {
		it.err = err
		return
	}
	it.i = end
}

// decodeKey returns the decoded key raw (a valid JSON string body). Keys
// longer than buf once decoded match none ramjet reads; they are returned
// raw, which cannot equal a short name.
func decodeKey(raw []byte, escaped bool, buf *[24]byte) []byte {
	if !escaped {
		return raw
	}
	return decodeKeySlow(raw, buf)
}

func decodeKeySlow(raw []byte, buf *[24]byte) []byte {
	out := buf[:0]
	for s := raw; len(s) > 0; {
		k := bytes.IndexByte(s, '\\')
		if k < 0 {
			k = len(s)
		}
		if len(out)+k > len(buf) {
			return raw
		}
		out = append(out, s[:k]...)
		s = s[k:]
		if len(s) == 0 {
			break
		}
		var e [utf8.UTFMax]byte
		d, n := escape1(s, &e)
		if len(out)+len(d) > len(buf) {
			return raw
		}
		out = append(out, d...)
		s = s[n:]
	}
	return out
}

// escape1 decodes the valid escape at the start of s (s[0] == '\\') as
// encoding/json does (an unpaired surrogate becomes U+FFFD). It returns the
// decoded bytes (in buf) and how many bytes of s it consumed.
func escape1(s []byte, buf *[utf8.UTFMax]byte) ([]byte, int) {
	if len(s) < 2 {
		return nil, len(s)
	}
	if s[1] == 'u' {
		r, n := decodeU(s)
		m := utf8.EncodeRune(buf[:], r)
		return buf[:m], n
	}
	buf[0] = shortEscape(s[1])
	return buf[:1], 2
}

// shortEscape is the byte a valid two-byte escape \c stands for ('"',
// '\\' and '/' stand for themselves).
func shortEscape(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c
}

// unescapeTo decodes the body of a valid JSON string (without quotes) and
// writes it to the fingerprint without allocating, in one loop over the
// runs and escapes: a run of up to 16 bytes (text dense with escapes, such
// as JSON inside a string) is moved into the gather buffer in one 16-byte
// copy, a longer one put; a one-byte escape is stored directly. The staging
// replay sees the writes it always saw: each run, then each escape's
// bytes.
func unescapeTo(s []byte, k *blocker) {
	var e [utf8.UTFMax]byte
	for len(s) > 0 {
		j := backslashIndex(s)
		if j > 0 {
			k.total += j
			k.stage(j)
			if f := k.fill; j <= 16 && len(s) >= 16 && f+j < k.chunk && f <= blockBuf-16 {
				// The bytes past the run land past fill, where the
				// stream's next bytes overwrite them.
				*(*[16]byte)(k.buf[f:]) = *(*[16]byte)(s)
				k.fill = f + j
			} else {
				k.put(s[:j])
			}
			if j == len(s) {
				return
			}
		}
		// s[j] == '\\'
		if s[j+1] == 'u' {
			d, n := escape1(s[j:], &e)
			k.total += len(d)
			k.stage(len(d))
			k.put(d)
			s = s[j+n:]
			continue
		}
		c := shortEscape(s[j+1])
		k.total++
		k.stage(1)
		if f := k.fill; f+1 < k.chunk {
			k.buf[f] = c
			k.fill = f + 1
		} else {
			k.put([]byte{c})
		}
		s = s[j+2:]
	}
}

// backslashIndex is bytes.IndexByte(s, '\\'), len(s) for none, looking at
// the first 16 bytes a word at a time before IndexByte's call.
func backslashIndex(s []byte) int {
	if len(s) < 16 {
		for j, c := range s {
			if c == '\\' {
				return j
			}
		}
		return len(s)
	}
	const bs = lsb * '\\'
	for j := 0; j < 16; j += 8 {
		x := binary.LittleEndian.Uint64(s[j:]) ^ bs
		if m := (x - lsb) &^ x & msb; m != 0 {
			return j + bits.TrailingZeros64(m)>>3
		}
	}
	if r := bytes.IndexByte(s[16:], '\\'); r >= 0 {
		return 16 + r
	}
	return len(s)
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

// decodeU decodes a validated "\uXXXX" (and a following low surrogate) at
// the start of s and returns the rune and the bytes consumed.
func decodeU(s []byte) (rune, int) {
	r, ok := hex4(s[2:])
	if !ok {
		return utf8.RuneError, 2
	}
	if r >= 0xD800 && r < 0xDC00 {
		if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
			if r2, ok := hex4(s[8:]); ok && r2 >= 0xDC00 && r2 < 0xE000 {
				return (r-0xD800)<<10 | (r2 - 0xDC00) + 0x10000, 12
			}
		}
		return utf8.RuneError, 6
	}
	if r >= 0xDC00 && r < 0xE000 {
		return utf8.RuneError, 6
	}
	return r, 6
}

// laxSkip skips the valid JSON value at b[i] (no whitespace before it).
func laxSkip(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch c := b[i]; c {
		case '"':
			i, _ = laxString(b, i)
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		default:
			if depth == 0 {
				// A number or literal.
				for i < len(b) && !isWS(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
					i++
				}
				return i
			}
		}
		i++
	}
	return i
}

// IntField names one integer member for IntFields: Name at the top level
// of the object, or, with Parent set, Name inside the top-level object
// member Parent.
type IntField struct{ Parent, Name string }

// IntFields reads the integer members fields of the JSON object b into out
// (len(out) == len(fields)) as json.Unmarshal reads them into int64 fields
// of a struct (and of its struct-valued members): a key matches a name as
// encoding/json matches a field name (bytes.EqualFold), the last occurrence
// wins, and a null or absent member leaves out[i] as it is. It is the
// allocation-free fast path of such a decode (the engines' usage objects):
// decided reports that b is one valid JSON object (whitespace around it
// allowed) which json.Unmarshal would decode without error into exactly
// out. It is false, with out partly written, for anything it leaves to
// encoding/json: malformed JSON, an escaped key, a field holding something
// other than an integer that fits int64 (or, for a parent, an object), so
// that the caller decodes b with encoding/json then and gets its answer
// to the last detail.
func IntFields(b []byte, fields []IntField, out []int64) (decided bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	end, ok := intMembers(b, i, 1, "", fields, out, nil, nil)
	if !ok {
		return false
	}
	return skipWS(b, end) == len(b)
}

// IntFieldSet is fields prepared once for Ints: for each key length, the
// fields an ASCII key of that length may match, in fields' order, so that
// a key is folded against those alone (matchField walks every field for
// every key).
type IntFieldSet struct {
	fields []IntField
	top    [][]fieldMatch   // at the top level, by key length
	sub    [][][]fieldMatch // inside the object of fields[k].Parent, by key length
}

// fieldMatch is one field a key may match: fields[k].Name, or its Parent
// (nested).
type fieldMatch struct {
	k      int
	nested bool
	name   string
}

// NewIntFieldSet prepares fields for Ints (fields is kept: not to be
// changed after).
func NewIntFieldSet(fields []IntField) *IntFieldSet {
	s := &IntFieldSet{fields: fields, sub: make([][][]fieldMatch, len(fields))}
	add := func(t *[][]fieldMatch, m fieldMatch) {
		for len(*t) <= len(m.name) {
			*t = append(*t, nil)
		}
		(*t)[len(m.name)] = append((*t)[len(m.name)], m)
	}
	for k, f := range fields {
		if f.Parent == "" {
			add(&s.top, fieldMatch{k, false, f.Name})
			continue
		}
		add(&s.top, fieldMatch{k, true, f.Parent})
		for j, g := range fields {
			if g.Parent == f.Parent {
				add(&s.sub[k], fieldMatch{j, false, g.Name})
			}
		}
	}
	return s
}

// Ints is IntFields(b, fields, out) for the set's fields, the same answer.
func (s *IntFieldSet) Ints(b []byte, out []int64) (decided bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	end, ok := intMembers(b, i, 1, "", s.fields, out, s, s.top)
	if !ok {
		return false
	}
	return skipWS(b, end) == len(b)
}

// IntsObject is Ints for the object that starts b (b[0] == '{'), which
// anything may follow (a body read past the object): it returns the index
// just past the object. decided means that Ints(b[:end], out) decides,
// with the same out (the walk reads nothing of b past end that changes
// what it finds); false says nothing of b[:end], which the caller then
// decodes as before.
func (s *IntFieldSet) IntsObject(b []byte, out []int64) (end int, decided bool) {
	if len(b) == 0 || b[0] != '{' {
		return 0, false
	}
	return intMembers(b, 0, 1, "", s.fields, out, s, s.top)
}

// match is matchField(key, parent, s.fields), t the fields of parent's
// object by key length.
func (s *IntFieldSet) match(key []byte, parent string, t [][]fieldMatch) (k int, nested bool) {
	if !isASCII(key) {
		return matchField(key, parent, s.fields)
	}
	if n := len(key); n < len(t) {
		for _, m := range t[n] {
			if asciiFold(key, m.name) {
				return m.k, m.nested
			}
		}
	}
	return -1, false
}

// intMembers walks the object at b[i] == '{' whose members are at depth,
// reading the fields of parent (top level: ""), and returns the index
// past it. With set, keys are matched with set.match over t (the fields
// of parent's object by key length), else with matchField.
func intMembers(b []byte, i, depth int, parent string, fields []IntField, out []int64, set *IntFieldSet, t [][]fieldMatch) (int, bool) {
	it := newObjectIter(b, i, depth)
	for it.next() {
		if it.esc {
			return 0, false
		}
		var k int
		var nested bool
		if set != nil {
			k, nested = set.match(it.key, parent, t)
		} else {
			k, nested = matchField(it.key, parent, fields)
		}
		switch {
		case k >= 0 && !nested:
			end, ok := intValue(b, it.val, &out[k])
			if !ok {
				return 0, false
			}
			it.i = end
		case k >= 0:
			switch b[it.val] {
			case 'n':
				it.skip() // null: the struct stays as it is
			case '{':
				var sub [][]fieldMatch
				if set != nil {
					sub = set.sub[k]
				}
				end, ok := intMembers(b, it.val, depth+1, fields[k].Parent, fields, out, set, sub)
				if !ok {
					return 0, false
				}
				it.i = end
			default:
				return 0, false
			}
		default:
			// A member read by no field: a number (total_tokens) is
			// validated here, without skipValue's dispatch.
			if c := b[it.val]; c == '-' || c >= '0' && c <= '9' {
				end, err := scanNumber(b, it.val)
				if err != nil {
					return 0, false
				}
				it.i = end
				continue
			}
			it.skip()
		}
	}
	if it.err != nil {
		return 0, false
	}
	return it.end, true
}

// matchField returns the first field of fields that key matches in the
// object of parent (top level: ""): its Name there, or, at the top level,
// the Parent of a nested field (nested true); -1 when none does. A name
// matches as keyFold has it; the key's ASCII test is done once, and an
// ASCII key is folded only against the names as long as it.
func matchField(key []byte, parent string, fields []IntField) (k int, nested bool) {
	if !isASCII(key) {
		for k := range fields {
			f := &fields[k]
			if f.Parent == parent {
				if keyFold(key, f.Name) {
					return k, false
				}
			} else if parent == "" && keyFold(key, f.Parent) {
				return k, true
			}
		}
		return -1, false
	}
	n := len(key)
	for k := range fields {
		f := &fields[k]
		if len(f.Name) == n && f.Parent == parent {
			if asciiFold(key, f.Name) {
				return k, false
			}
		} else if parent == "" && n > 0 && len(f.Parent) == n && asciiFold(key, f.Parent) {
			return k, true
		}
	}
	return -1, false
}

// keyFold is bytes.EqualFold(key, name) for an ASCII name, without its
// walk over the two when they cannot match: a key shorter than the name
// never matches, nor does one of ASCII bytes only unless it is as long
// (only a multi-byte character, such as the Kelvin sign, folds to an
// ASCII letter; for the same reason a key as long as the name matches
// only if it is ASCII).
func keyFold(key []byte, name string) bool {
	switch {
	case len(key) < len(name):
		return false
	case isASCII(key):
		return len(key) == len(name) && asciiFold(key, name)
	}
	return len(key) > len(name) && bytes.EqualFold(key, []byte(name))
}

// asciiFold is bytes.EqualFold(key, name) for an ASCII key as long as the
// ASCII name: their first bytes must agree up to ASCII case before the
// whole is folded.
func asciiFold(key []byte, name string) bool {
	return string(key) == name || key[0]|0x20 == name[0]|0x20 && bytes.EqualFold(key, []byte(name))
}

// isASCII reports whether b holds ASCII bytes only, a word at a time (the
// last word overlapping the one before it: no byte loop for a key of 8
// bytes or more).
func isASCII(b []byte) bool {
	if len(b) < 8 {
		for _, c := range b {
			if c >= 0x80 {
				return false
			}
		}
		return true
	}
	x := binary.LittleEndian.Uint64(b[len(b)-8:])
	for ; len(b) > 8; b = b[8:] {
		x |= binary.LittleEndian.Uint64(b)
	}
	return x&msb == 0
}

// intValue reads the integer or null at b[i] into *dst (null: left as is)
// and returns the index past it; ok is false for any other value, or a
// number that is not an integer within int64 (encoding/json's
// strconv.ParseInt). It validates and converts the digits in one walk
// (what follows them is the caller's to check, as after scanNumber).
func intValue(b []byte, i int, dst *int64) (int, bool) {
	if b[i] == 'n' {
		end, err := literal(b, i, "null")
		return end, err == nil
	}
	neg := b[i] == '-'
	j := i
	if neg {
		j++
	}
	start := j
	var n uint64
	for ; j < len(b); j++ {
		d := b[j] - '0'
		if d > 9 {
			break
		}
		n = n*10 + uint64(d) // wraps past 19 digits, refused below
	}
	switch {
	case j == start, j-start > 1 && b[start] == '0':
		return 0, false // not a number (or "-" alone), or a leading zero
	case j-start > 19:
		return 0, false // beyond int64 (19 digits stay below 1<<64)
	case j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E'):
		return 0, false // a fraction or an exponent
	case !neg && n > 1<<63-1, neg && n > 1<<63:
		return 0, false
	case neg:
		*dst = -int64(n)
	default:
		*dst = int64(n)
	}
	return j, true
}
