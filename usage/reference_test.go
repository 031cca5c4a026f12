package usage

import (
	"bytes"
	"testing"
)

// refScanner is the Scanner as it was before object() appended the usage
// object in bulk (one byte per append): FuzzScannerMatchesReference holds
// the Scanner to its states, buffers and results.
type refScanner struct {
	// partial is how many leading bytes of usageKey end the data seen so
	// far (idle state only); partialEsc: a backslash came right before
	// them.
	partial    int
	partialEsc bool
	prev       byte // the last byte seen

	state      int
	inStr, esc bool
	depth      int
	cur        []byte // the object being read
	last       []byte // the last complete object
}

// Write scans p. It never fails.
func (s *refScanner) Write(p []byte) {
	if len(p) == 0 {
		return
	}
	before := s.prev // the byte before p[0]
	s.prev = p[len(p)-1]
	for len(p) > 0 {
		if s.state != usageIdle {
			n := s.step(p)
			if n > 0 {
				before = p[n-1]
			}
			p = p[n:]
			continue
		}
		if s.partial > 0 {
			need := usageKey[s.partial:]
			n := min(len(need), len(p))
			if string(p[:n]) == string(need[:n]) {
				if n < len(need) {
					s.partial += n
					return
				}
				s.partial = 0
				if !s.partialEsc {
					s.state = usageAfterKey
				}
				before = p[n-1]
				p = p[n:]
				continue
			}
			s.partial = 0
		}
		i := bytes.Index(p, usageKey)
		if i < 0 {
			// Keep the longest suffix of p that begins the key.
			for k := min(len(usageKey)-1, len(p)); k > 0; k-- {
				if string(p[len(p)-k:]) == string(usageKey[:k]) {
					s.partial = k
					if k < len(p) {
						s.partialEsc = p[len(p)-k-1] == '\\'
					} else {
						s.partialEsc = before == '\\'
					}
					break
				}
			}
			return
		}
		esc := before == '\\'
		if i > 0 {
			esc = p[i-1] == '\\'
		}
		if !esc {
			s.state = usageAfterKey
		}
		before = p[i+len(usageKey)-1]
		p = p[i+len(usageKey):]
	}
}

// step runs the state machine after a key over p until it is idle again or
// p ends, and returns how many bytes it used.
func (s *refScanner) step(p []byte) int {
	for i, c := range p {
		switch s.state {
		case usageAfterKey, usageAfterCol:
			switch {
			case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			case c == ':' && s.state == usageAfterKey:
				s.state = usageAfterCol
			case c == '{' && s.state == usageAfterCol:
				s.state = usageObject
				s.depth = 1
				s.inStr, s.esc = false, false
				s.cur = append(s.cur[:0], c)
			default:
				// Not a key after all, or null: look for the next one (this
				// byte may begin it).
				s.state = usageIdle
				return i
			}
		case usageObject:
			if len(s.cur) >= maxUsageBytes {
				s.state = usageIdle
				s.cur = s.cur[:0]
				return i
			}
			s.cur = append(s.cur, c)
			switch {
			case c == '\n':
				s.inStr, s.esc = false, false // never inside a valid string
			case s.inStr:
				switch {
				case s.esc:
					s.esc = false
				case c == '\\':
					s.esc = true
				case c == '"':
					s.inStr = false
				}
			case c == '"':
				s.inStr = true
			case c == '{':
				s.depth++
			case c == '}':
				s.depth--
				if s.depth == 0 {
					s.cur, s.last = s.last[:0], s.cur
					s.state = usageIdle
					return i + 1
				}
			}
		}
	}
	return len(p)
}

func FuzzScannerMatchesReference(f *testing.F) {
	for _, s := range []string{chatJSONBody, chatSSEBody, continuousSSEBody, responsesSSEBody, brokenSSEBody, `{"usage":{`,
		`{"usage":{"a":"\\"}","b":{"c":1}}}`, `{"usage" : {"x":"\n}"}, "usage":null,"usage":{}}`} {
		f.Add([]byte(s), 7)
		f.Add([]byte(s), 1)
	}
	big := []byte(`{"usage":{"pad":"` + string(bytes.Repeat([]byte("x"), maxUsageBytes-12)) + `"},"usage":{"prompt_tokens":3}}`)
	f.Add(big, 1000)
	f.Add(big[:maxUsageBytes+40], 4096)
	f.Fuzz(func(t *testing.T, body []byte, step int) {
		if step <= 0 {
			step = 1
		}
		var s Scanner
		var r refScanner
		for b := body; len(b) > 0; {
			n := min(step, len(b))
			s.Write(b[:n])
			r.Write(b[:n])
			b = b[n:]
			if s.state != r.state || s.inStr != r.inStr || s.esc != r.esc || s.depth != r.depth ||
				s.partial != r.partial || s.partialEsc != r.partialEsc || s.prev != r.prev ||
				!bytes.Equal(s.cur, r.cur) || !bytes.Equal(s.last, r.last) {
				t.Fatalf("after %d bytes: scanner %+v, reference %+v", len(body)-len(b), s, r)
			}
			// The counts decoded while reading (Scanner.whole) are what
			// decoding the reference's last object gives.
			got, ok := s.Result()
			want, wantOK := refLastResult(r.last)
			if got != want || ok != wantOK {
				t.Fatalf("after %d bytes: Result %+v, %v; the reference's object %q decodes to %+v, %v", len(body)-len(b), got, ok, r.last, want, wantOK)
			}
		}
	})
}

// refLastResult is Result as it was before Scanner.whole: last, the last
// complete object, decoded after the body (fast, else encoding/json).
func refLastResult(last []byte) (Usage, bool) {
	if len(last) == 0 {
		return Usage{}, false
	}
	j := *newUsageJSON()
	if !j.fast(last) && !j.slow(last) {
		return Usage{}, false
	}
	return j.usage()
}
