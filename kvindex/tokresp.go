package kvindex

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// decodeTokenizeResponse reads an engine's /tokenize answer (vLLM:
// {"count":N,"max_model_len":M,"tokens":[...],"token_strs":null}): the
// token ids, checked against count when present, at most maxTokens. The
// common shape (plain keys, "tokens" an array of non-negative integers,
// "count" an integer, each at most once) is scanned directly into the
// result; anything else (escaped keys, nulls, repeated keys, numbers with
// a fraction or exponent) is decoded by encoding/json, with the same
// outcome.
func decodeTokenizeResponse(b []byte, maxTokens int) ([]uint32, error) {
	if toks, count, ok := scanTokenizeResponse(b); ok {
		if len(toks) > maxTokens {
			return nil, fmt.Errorf("tokenize response: more than %d tokens", maxTokens)
		}
		if count >= 0 && count != len(toks) {
			return nil, fmt.Errorf("tokenize response: count %d for %d tokens", count, len(toks))
		}
		return toks, nil
	}
	var out struct {
		Tokens []int64 `json:"tokens"`
		Count  *int    `json:"count"`
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&out); err != nil {
		return nil, fmt.Errorf("tokenize response: %w", err)
	}
	if len(out.Tokens) > maxTokens {
		return nil, fmt.Errorf("tokenize response: more than %d tokens", maxTokens)
	}
	if out.Count != nil && *out.Count != len(out.Tokens) {
		return nil, fmt.Errorf("tokenize response: count %d for %d tokens", *out.Count, len(out.Tokens))
	}
	toks := make([]uint32, len(out.Tokens))
	for i, v := range out.Tokens {
		if v < 0 || v > 1<<32-1 {
			return nil, fmt.Errorf("tokenize response: token id %d out of range", v)
		}
		toks[i] = uint32(v)
	}
	return toks, nil
}

// scanTokenizeResponse is decodeTokenizeResponse's fast path: ok false
// means "not the common shape, decode it in full". count is -1 when
// absent.
func scanTokenizeResponse(b []byte) (toks []uint32, count int, ok bool) {
	s := tokScanner{b: b}
	count = -1
	if !s.expect('{') {
		return nil, 0, false
	}
	seenTokens := false
	if s.peek() == '}' {
		return []uint32{}, count, false // no tokens key: let encoding/json say so
	}
	for {
		key, ok := s.key()
		if !ok || !s.expect(':') {
			return nil, 0, false
		}
		switch key {
		case "tokens":
			if seenTokens {
				return nil, 0, false
			}
			seenTokens = true
			if toks, ok = s.uintArray(); !ok {
				return nil, 0, false
			}
		case "count":
			if count >= 0 {
				return nil, 0, false
			}
			n, ok := s.uint()
			if !ok || n > 1<<31-1 {
				return nil, 0, false
			}
			count = int(n)
		default:
			if !s.skipValue(0) {
				return nil, 0, false
			}
		}
		switch s.next() {
		case ',':
			continue
		case '}':
			if !seenTokens {
				return nil, 0, false
			}
			return toks, count, true
		default:
			return nil, 0, false
		}
	}
}

type tokScanner struct {
	b []byte
	i int
}

func (s *tokScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek is the next non-space byte (0 at the end), not consumed.
func (s *tokScanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// next consumes and returns the next non-space byte (0 at the end).
func (s *tokScanner) next() byte {
	c := s.peek()
	if c != 0 {
		s.i++
	}
	return c
}

func (s *tokScanner) expect(c byte) bool { return s.next() == c }

// key reads an object key without escapes (a key with one is not the
// common shape).
func (s *tokScanner) key() (string, bool) {
	if !s.expect('"') {
		return "", false
	}
	start := s.i
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			k := s.b[start:s.i]
			s.i++
			// Only the two keys read are compared; no string is built.
			switch string(k) {
			case "tokens":
				return "tokens", true
			case "count":
				return "count", true
			}
			return "", true
		case c == '\\' || c < 0x20:
			return "", false
		}
		s.i++
	}
	return "", false
}

// uint reads a non-negative integer without sign, fraction or exponent
// that fits 32 bits.
func (s *tokScanner) uint() (uint64, bool) {
	s.ws()
	start := s.i
	var n uint64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		n = n*10 + uint64(s.b[s.i]-'0')
		if n > 1<<32-1 {
			return 0, false
		}
		s.i++
	}
	if s.i == start || (s.b[start] == '0' && s.i-start > 1) {
		return 0, false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	return n, true
}

// uintArray reads [n, n, ...] into a new slice sized by a count of commas.
func (s *tokScanner) uintArray() ([]uint32, bool) {
	if !s.expect('[') {
		return nil, false
	}
	if s.peek() == ']' {
		s.i++
		return []uint32{}, true
	}
	end := bytes.IndexByte(s.b[s.i:], ']')
	if end < 0 {
		return nil, false
	}
	out := make([]uint32, 0, bytes.Count(s.b[s.i:s.i+end], []byte{','})+1)
	for {
		n, ok := s.uint()
		if !ok {
			return nil, false
		}
		out = append(out, uint32(n))
		switch s.next() {
		case ',':
		case ']':
			return out, true
		default:
			return nil, false
		}
	}
}

// skipValue skips one JSON value (checked only as far as needed to find
// its end; encoding/json judges the rest when the shape is not common).
func (s *tokScanner) skipValue(depth int) bool {
	if depth > 64 {
		return false
	}
	switch c := s.next(); c {
	case '"':
		for s.i < len(s.b) {
			switch c := s.b[s.i]; {
			case c == '\\':
				if !s.escape() {
					return false
				}
				continue
			case c == '"':
				s.i++
				return true
			case c < 0x20:
				return false
			}
			s.i++
		}
		return false
	case '[', '{':
		closer := byte(']')
		if c == '{' {
			closer = '}'
		}
		if s.peek() == closer {
			s.i++
			return true
		}
		for {
			if c == '{' {
				if _, ok := s.key(); !ok || !s.expect(':') {
					return false
				}
			}
			if !s.skipValue(depth + 1) {
				return false
			}
			switch s.next() {
			case ',':
			case closer:
				return true
			default:
				return false
			}
		}
	case 0:
		return false
	default:
		s.i--
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
				s.i += len(lit)
				return true
			}
		}
		return s.number()
	}
}

// escape checks and skips one escape sequence in a string (s.i at the
// backslash).
func (s *tokScanner) escape() bool {
	if s.i+1 >= len(s.b) {
		return false
	}
	switch s.b[s.i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.i += 2
		return true
	case 'u':
		if s.i+6 > len(s.b) {
			return false
		}
		for _, c := range s.b[s.i+2 : s.i+6] {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
		s.i += 6
		return true
	}
	return false
}

// number checks and skips one JSON number:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *tokScanner) number() bool {
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if digits() == 0 {
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}
