package usage

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"

	"github.com/ramjet-llm/ramjet/selection"
)

// maxUsageBytes bounds the one "usage" object the scanner keeps: an OpenAI
// usage object is a few hundred bytes; a larger one is ignored.
const maxUsageBytes = 4096

// Usage is the token accounting an engine reports in a response's "usage"
// object: chat and text completions (prompt_tokens,
// prompt_tokens_details.cached_tokens, completion_tokens) and the Responses
// API (input_tokens, input_tokens_details.cached_tokens, output_tokens).
type Usage struct {
	PromptTokens     int64
	CachedTokens     int64
	CompletionTokens int64
	// CachedUnreported: the object had no cached count (vLLM without
	// --enable-prompt-tokens-details, SGLang without --enable-cache-report
	// send "prompt_tokens_details": null or none); CachedTokens is 0 then
	// and says nothing about what the engine held.
	CachedUnreported bool
}

// Cached is the cached prompt tokens as selection.Router.Observe takes
// them: CachedTokens, or -1 (unknown, not "none cached") when the object
// had no cached count (CachedUnreported).
func (u Usage) Cached() int {
	if u.CachedUnreported {
		return -1
	}
	return int(u.CachedTokens)
}

// Scanner finds the last "usage" object of a JSON or server-sent-events
// response body as the body streams past, without buffering it. It looks
// for the key "usage" with bytes.Index: in valid JSON the bytes "usage"
// (quotes included) followed by a colon can only be a key, since a quote
// inside a string is escaped (\"usage\" never matches) and a string value
// is never followed by a colon; a match right after a backslash is skipped.
// It then reads the object after the colon, tracking strings and nesting,
// and keeps at most maxUsageBytes of it. A key split across two writes is
// found through the partial match kept between them. It never changes the
// body; feed it every chunk in order with Write, then call Result.
//
// The zero value is ready to use. It is not safe for concurrent use.
type Scanner struct {
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
	// lastInts is last decoded by usageSet.IntsObject as last was read
	// (when lastRead; Result then reads no byte of it again).
	lastInts [6]int64
	lastRead bool
}

var usageKey = []byte(`"usage"`)

const (
	usageIdle     = iota
	usageAfterKey // read the key "usage", want ':'
	usageAfterCol // read ':', want '{'
	usageObject   // inside the usage object
)

// Write scans p. It never fails.
func (s *Scanner) Write(p []byte) {
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
		i := indexKey(p)
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

// keyTail is usageKey without its opening quote: quotes are every few
// bytes of a JSON body, a 'u' seldom, so that bytes.Index, which looks
// for its first byte before it compares, tries fewer places.
var keyTail = usageKey[1:]

// indexKey is bytes.Index(p, usageKey): the first keyTail found with a
// quote right before it.
func indexKey(p []byte) int {
	for i := 1; i < len(p); {
		j := bytes.Index(p[i:], keyTail)
		if j < 0 {
			return -1
		}
		if i += j; p[i-1] == '"' {
			return i - 1
		}
		i++
	}
	return -1
}

// step runs the state machine after a key over p until it is idle again or
// p ends, and returns how many bytes it used.
func (s *Scanner) step(p []byte) int {
	for i, c := range p {
		if s.state == usageObject {
			return i + s.object(p[i:])
		}
		switch {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
		case c == ':' && s.state == usageAfterKey:
			s.state = usageAfterCol
		case c == '{' && s.state == usageAfterCol:
			if n := s.whole(p[i:]); n > 0 {
				return i + n
			}
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
	}
	return len(p)
}

// whole reads the usage object that starts p (p[0] == '{') in one walk
// when p holds all of it and usageSet.IntsObject decodes it (the usual
// answer; an object laid out as one decoded before is read by its layout,
// shape.go, without walking its JSON): as object would, it keeps the object as last and goes idle,
// and it keeps the decoded counts, so that Result does not walk the
// object a second time. It returns the object's length, or 0 (nothing
// done) for one that object reads byte by byte instead: split across
// writes, larger than maxUsageBytes, or left to encoding/json. IntsObject
// decides only a valid JSON object, whose end is the brace object's
// string and nesting tracking closes on.
func (s *Scanner) whole(p []byte) int {
	out := [6]int64{absent, absent, absent, absent, absent, absent}
	end, ok := matchShapes(p, &out)
	if !ok {
		if end, ok = usageSet.IntsObject(p, out[:]); ok && end <= maxUsageBytes {
			learnShape(p[:end])
		}
	}
	if !ok || end > maxUsageBytes {
		return 0
	}
	s.cur = append(s.cur[:0], p[:end]...)
	s.cur, s.last = s.last[:0], s.cur
	s.lastInts, s.lastRead = out, true
	s.state, s.depth = usageIdle, 0
	s.inStr, s.esc = false, false
	return end
}

// object reads p inside the usage object, tracking strings and nesting,
// until the object closes, it would grow past maxUsageBytes (it is then
// dropped, and the byte that would pass the bound is left to the idle
// state), or p ends; it returns how many bytes it used. The bytes it
// used are appended to cur at once, not one by one.
func (s *Scanner) object(p []byte) int {
	limit := min(len(p), max(maxUsageBytes-len(s.cur), 0))
	for i := 0; i < limit; i++ {
		c := p[i]
		if !objectByte[c] && !s.esc {
			continue // a byte that changes nothing below
		}
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
			// Inside a string only a quote, a backslash or a newline
			// changes anything: skip to the byte before the first one,
			// a word at a time.
			for i+9 <= limit {
				if m := inStringMask(binary.LittleEndian.Uint64(p[i+1:])); m != 0 {
					i += bits.TrailingZeros64(m) >> 3
					break
				}
				i += 8
			}
		case c == '{':
			s.depth++
		case c == '}':
			s.depth--
			if s.depth == 0 {
				s.cur = append(s.cur, p[:i+1]...)
				s.cur, s.last = s.last[:0], s.cur
				s.lastRead = false
				s.state = usageIdle
				return i + 1
			}
		}
	}
	if limit < len(p) {
		// The object reached maxUsageBytes with bytes left: too large.
		s.state = usageIdle
		s.cur = s.cur[:0]
		return limit
	}
	s.cur = append(s.cur, p...)
	return len(p)
}

// inStringMask returns a mask whose lowest set bit is the high bit of the
// first byte of x (little endian) that is '"', '\\' or '\n'; 0 when there
// is none. Each "has zero byte" term is exact at its lowest set bit, so
// their union is exact there too.
func inStringMask(x uint64) uint64 {
	const lsb, msb = 0x0101010101010101, 0x8080808080808080
	q, b, n := x^(lsb*'"'), x^(lsb*'\\'), x^(lsb*'\n')
	return ((q-lsb)&^q | (b-lsb)&^b | (n-lsb)&^n) & msb
}

// objectByte marks the bytes object's state machine acts on (all others
// only clear an escape).
var objectByte = [256]bool{'\n': true, '"': true, '\\': true, '{': true, '}': true}

// usageJSON is both usage shapes. Absent counts stay at absent (-1):
// value fields, not pointers, so that the decode allocates nothing for
// them.
type usageJSON struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	PromptDetails    struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	InputDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// usageFields are usageJSON's fields for selection.IntFields, in the order
// of fast's out.
var usageFields = []selection.IntField{
	{Name: "prompt_tokens"}, {Name: "completion_tokens"},
	{Parent: "prompt_tokens_details", Name: "cached_tokens"},
	{Name: "input_tokens"}, {Name: "output_tokens"},
	{Parent: "input_tokens_details", Name: "cached_tokens"},
}

// usageSet is usageFields prepared once for selection.IntFieldSet.Ints.
var usageSet = selection.NewIntFieldSet(usageFields)

// fast decodes b into j with selection.IntFieldSet.Ints, which reads the common
// usage object without encoding/json's reflection; false leaves the decode
// to json.Unmarshal (j partly written).
func (j *usageJSON) fast(b []byte) bool {
	out := [6]int64{j.PromptTokens, j.CompletionTokens, j.PromptDetails.CachedTokens, j.InputTokens, j.OutputTokens, j.InputDetails.CachedTokens}
	if !usageSet.Ints(b, out[:]) {
		return false
	}
	j.setInts(out)
	return true
}

// setInts sets j's counts from out, in usageFields' order.
func (j *usageJSON) setInts(out [6]int64) {
	j.PromptTokens, j.CompletionTokens, j.PromptDetails.CachedTokens = out[0], out[1], out[2]
	j.InputTokens, j.OutputTokens, j.InputDetails.CachedTokens = out[3], out[4], out[5]
}

// slow decodes b into j with encoding/json (what fast does not decide),
// from the absent state; false on a decode error. Its own copy escapes to
// the heap, j does not.
func (j *usageJSON) slow(b []byte) bool {
	v := newUsageJSON()
	if err := json.Unmarshal(b, v); err != nil {
		return false
	}
	*j = *v
	return true
}

// newUsageJSON is a usageJSON with every count absent.
func newUsageJSON() *usageJSON {
	j := &usageJSON{PromptTokens: absent, CompletionTokens: absent, InputTokens: absent, OutputTokens: absent}
	j.PromptDetails.CachedTokens, j.InputDetails.CachedTokens = absent, absent
	return j
}

// absent marks a count the usage object did not have (a real count is
// never negative: a negative one is rejected below all the same).
const absent = -1 << 62

// Result parses the last usage object seen. ok is false when the body had
// none (or none that parses with a prompt token count).
func (s *Scanner) Result() (u Usage, ok bool) {
	if len(s.last) == 0 {
		return Usage{}, false
	}
	j := *newUsageJSON()
	if s.lastRead {
		j.setInts(s.lastInts)
	} else if !j.fast(s.last) && !j.slow(s.last) {
		return Usage{}, false
	}
	return j.usage()
}

// usage is the decoded object as a Usage: the prompt and completion counts
// of whichever shape it has (Chat Completions, else Responses), false when
// it has neither or a negative count.
func (j *usageJSON) usage() (u Usage, ok bool) {
	orZero := func(n int64) int64 {
		if n == absent {
			return 0
		}
		return n
	}
	switch {
	case j.PromptTokens != absent:
		u.PromptTokens = j.PromptTokens
		u.CompletionTokens = orZero(j.CompletionTokens)
		u.CachedTokens = j.PromptDetails.CachedTokens
	case j.InputTokens != absent:
		u.PromptTokens = j.InputTokens
		u.CompletionTokens = orZero(j.OutputTokens)
		u.CachedTokens = j.InputDetails.CachedTokens
	default:
		return Usage{}, false
	}
	if u.CachedTokens == absent {
		u.CachedTokens, u.CachedUnreported = 0, true
	}
	if u.PromptTokens < 0 || u.CachedTokens < 0 || u.CompletionTokens < 0 {
		return Usage{}, false
	}
	u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
	return u, true
}

// Reset clears s for reuse, keeping its buffers.
func (s *Scanner) Reset() {
	cur, last := s.cur[:0], s.last[:0]
	*s = Scanner{} // cleared in place, then the buffers kept
	s.cur, s.last = cur, last
}
