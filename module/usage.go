package module

import (
	"encoding/json"
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
}

// usageScanner finds the last "usage" object of a JSON or server-sent-events
// response body as the body streams past, without buffering it: it tracks
// only whether it is inside a JSON string, the first bytes of the current
// string (to recognise the key), and the bytes of the usage object being
// read (at most maxUsageBytes). It never changes the body; feed it every
// chunk in order with Write, then call Result.
//
// A raw newline cannot occur inside a valid JSON string, so the string
// state is reset at every newline: a malformed SSE event cannot derail the
// events after it.
//
// The zero value is ready to use. It is not safe for concurrent use.
type usageScanner struct {
	inStr, esc bool

	// key holds the first bytes of the current string, to recognise the
	// key "usage"; keyLen counts them, past len(key) it is not the key.
	key    [6]byte
	keyLen int

	state int
	depth int
	cur   []byte // the object being read
	last  []byte // the last complete object
}

const (
	usageIdle     = iota
	usageAfterKey // read the key "usage", want ':'
	usageAfterCol // read ':', want '{'
	usageObject   // inside the usage object
)

// strStop marks the bytes that matter inside a JSON string.
var strStop = [256]bool{'"': true, '\\': true, '\n': true}

// Write scans p. It never fails.
func (s *usageScanner) Write(p []byte) {
	for i := 0; i < len(p); i++ {
		if s.inStr && !s.esc && s.keyLen > len(s.key) && s.state != usageObject {
			// Fast path: skip the rest of a string that is not the key.
			for i < len(p) && !strStop[p[i]] {
				i++
			}
			if i == len(p) {
				return
			}
		}
		c := p[i]
		if s.state == usageObject {
			if len(s.cur) >= maxUsageBytes {
				s.state = usageIdle
				s.cur = s.cur[:0]
			} else {
				s.cur = append(s.cur, c)
			}
		}
		if c == '\n' {
			s.inStr, s.esc = false, false
			if s.state == usageObject {
				continue
			}
		}
		if s.inStr {
			switch {
			case s.esc:
				s.esc = false
				s.keyLen = len(s.key) + 1 // an escaped key is not "usage"
			case c == '\\':
				s.esc = true
			case c == '"':
				s.inStr = false
				if s.state == usageIdle && s.keyLen == 5 && string(s.key[:5]) == "usage" {
					s.state = usageAfterKey
				}
			default:
				if s.keyLen < len(s.key) {
					s.key[s.keyLen] = c
				}
				s.keyLen++
			}
			continue
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '"':
			s.inStr = true
			s.keyLen = 0
			if s.state == usageAfterKey || s.state == usageAfterCol {
				s.state = usageIdle
			}
			continue
		}
		switch s.state {
		case usageAfterKey:
			if c == ':' {
				s.state = usageAfterCol
			} else {
				s.state = usageIdle
			}
		case usageAfterCol:
			if c == '{' {
				s.state = usageObject
				s.depth = 1
				s.cur = append(s.cur[:0], c)
			} else {
				s.state = usageIdle // null, or not an object
			}
		case usageObject:
			switch c {
			case '{':
				s.depth++
			case '}':
				s.depth--
				if s.depth == 0 {
					s.cur, s.last = s.last[:0], s.cur
					s.state = usageIdle
				}
			}
		}
	}
}

// usageJSON is both usage shapes.
type usageJSON struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
	PromptDetails    *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokens  *int64 `json:"input_tokens"`
	OutputTokens *int64 `json:"output_tokens"`
	InputDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// Result parses the last usage object seen. ok is false when the body had
// none (or none that parses with a prompt token count).
func (s *usageScanner) Result() (u Usage, ok bool) {
	if len(s.last) == 0 {
		return Usage{}, false
	}
	var j usageJSON
	if err := json.Unmarshal(s.last, &j); err != nil {
		return Usage{}, false
	}
	switch {
	case j.PromptTokens != nil:
		u.PromptTokens = *j.PromptTokens
		if j.CompletionTokens != nil {
			u.CompletionTokens = *j.CompletionTokens
		}
		if j.PromptDetails != nil {
			u.CachedTokens = j.PromptDetails.CachedTokens
		}
	case j.InputTokens != nil:
		u.PromptTokens = *j.InputTokens
		if j.OutputTokens != nil {
			u.CompletionTokens = *j.OutputTokens
		}
		if j.InputDetails != nil {
			u.CachedTokens = j.InputDetails.CachedTokens
		}
	default:
		return Usage{}, false
	}
	if u.PromptTokens < 0 || u.CachedTokens < 0 || u.CompletionTokens < 0 {
		return Usage{}, false
	}
	u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
	return u, true
}

// Reset clears s for reuse, keeping its buffers.
func (s *usageScanner) Reset() {
	*s = usageScanner{cur: s.cur[:0], last: s.last[:0]}
}
