package selection

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// The differential fuzzers: Parse against encoding/json in both
// directions (every body encoding/json accepts is accepted or refused
// only for a field type the reference decoding also finds wrong; every
// body it rejects is rejected as malformed), and Parse's features against
// a reference built from encoding/json's decoding of the same body: the
// model, the scalars, the prompt spans and the block hashes of the
// canonical prompt.
//
// Run one for a minute with, e.g.:
//
//	go test ./selection -run '^$' -fuzz '^FuzzParse$' -fuzztime 60s
//
// go test runs the seed corpus (f.Add and testdata/fuzz).

var fuzzEndpoints = []Endpoint{EndpointChat, EndpointCompletions, EndpointResponses, EndpointUnknown}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
		`{"model":"m","prompt":["a","b",[1,2]],"max_tokens":3}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"\u00e9"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"a":1}]}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"x"}],"instructions":"s","tools":[ {"b" : 2} ]}`,
		`{"\u006dodel":"a\u002fb","cache_salt":"s\n","stream":true,"max_completion_tokens":7}`,
		`{"model":"x","model":1}`, `{"model":1,"model":"x"}`, `{"messages":"hi"}`, `{"messages":[1]}`,
		`{"messages":[{"role":"a","ro\u006ce":"b","content":null,"tool_calls":[{"id":1}],"tool_call_id":"t"}]}`,
		`[1]`, `"s"`, `{`, `{"a":}`, `{"a":01}`, `{"a":1.}`, `{"a":"\x"}`, "{\"a\":\"\x01\"}",
		` {"a":[[[]]]} `, `{"a":1} {}`, `{"a":-}`, `{"a":1e}`, `{"a":tru}`, ``, "{\"a\":\"\xff\"}",
		`{"a":"\ud800\udc00\ud800"}`, `{"max_tokens":-0}`, `{"max_tokens":1e3}`, `{"stream":null}`,
		// Strings long enough for hasControl's 64-byte blocks, with a
		// control byte in a block, in the tail, or none.
		`{"messages":[{"role":"user","content":"` + strings.Repeat("abcd", 80) + `"}]}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"" + strings.Repeat("abcd", 30) + "\x1f" + strings.Repeat("abcd", 50) + "\"}]}",
		"{\"prompt\":\"" + strings.Repeat("abcd", 79) + "\n\"}",
	} {
		f.Add([]byte(s))
	}
	x := NewExtractor(testConfig())
	feat := x.NewFeatures()
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, ep := range fuzzEndpoints {
			checkParse(t, x, ep, body, feat)
		}
	})
}

// FuzzParseChat builds valid chat bodies from fuzzed strings, with the
// keys in either order, optionally escaped, and optional whitespace, so
// that the fuzzer reaches deep into the prompt walk.
func FuzzParseChat(f *testing.F) {
	f.Add("qwen3-32b", "system", "You are \"careful\".\n", "hi", uint8(0))
	f.Add("a/b", "user", "\u00e9\U0001F600", "", uint8(0xff))
	f.Add("", "", "", "x", uint8(0x5a))
	x := NewExtractor(testConfig())
	feat := x.NewFeatures()
	f.Fuzz(func(t *testing.T, model, role, content, tool string, mode uint8) {
		body := chatFromParts(model, role, content, tool, mode)
		if !json.Valid(body) {
			t.Fatalf("generated invalid JSON: %q", body)
		}
		checkParse(t, x, EndpointChat, body, feat)
		if err := x.Parse(EndpointChat, body, feat); err != nil {
			t.Fatalf("Parse(%q) = %v, want no error", body, err)
		}
		if utf8.ValidString(model) && string(feat.Model) != model {
			t.Fatalf("model %q, want %q", feat.Model, model)
		}
	})
}

// chatFromParts renders a chat body; mode's bits choose the key order,
// escaped keys, \u-escaped strings, whitespace and content parts.
func chatFromParts(model, role, content, tool string, mode uint8) []byte {
	str := func(s string) string {
		if mode&4 == 0 {
			b, _ := json.Marshal(s)
			return string(b)
		}
		// Escape every ASCII letter as \u00XX (still the same string).
		const hex = "0123456789abcdef"
		var sb strings.Builder
		sb.WriteByte('"')
		for _, c := range s {
			if c >= 'a' && c <= 'z' {
				sb.WriteString(`\u00` + string(hex[c>>4]) + string(hex[c&15]))
				continue
			}
			b, _ := json.Marshal(string(c))
			sb.Write(b[1 : len(b)-1])
		}
		sb.WriteByte('"')
		return sb.String()
	}
	key := func(k string) string {
		if mode&2 != 0 {
			return `"\u00` + string("0123456789abcdef"[k[0]>>4]) + string("0123456789abcdef"[k[0]&15]) + k[1:] + `"`
		}
		return `"` + k + `"`
	}
	ws := ""
	if mode&8 != 0 {
		ws = " \n\t"
	}
	cont := str(content)
	if mode&16 != 0 {
		cont = `[{"type":"text","text":` + str(content) + `},{"type":"image_url","image_url":{"url":` + str(tool) + `}}]`
	}
	msg := `{` + key("role") + `:` + ws + str(role) + `,` + key("content") + `:` + cont + `}`
	if mode&32 != 0 {
		msg = `{` + key("content") + `:` + cont + `,` + ws + key("role") + `:` + str(role) + `}`
	}
	msgs := key("messages") + `:[` + msg + `,{"role":"assistant","content":null,"tool_calls":[{"id":` + str(tool) + `}]}]`
	tools := key("tools") + `:[{"type":"function","function":{"name":` + ws + str(tool) + `}}]`
	m := key("model") + `:` + str(model)
	if mode&1 != 0 {
		return []byte(`{` + msgs + `,` + ws + tools + `,` + m + `}`)
	}
	return []byte(`{` + m + `,` + tools + `,` + ws + msgs + `}`)
}

// checkParse compares Parse(ep, body) with encoding/json and the
// reference features.
func checkParse(t *testing.T, x Extractor, ep Endpoint, body []byte, feat *Features) {
	t.Helper()
	err := x.Parse(ep, body, feat)
	valid := json.Valid(body)
	var re *RequestError
	if err != nil && !errors.As(err, &re) {
		t.Fatalf("%v: error %T is not a *RequestError", ep, err)
	}
	switch {
	case !valid && err == nil:
		t.Fatalf("%v: accepted invalid JSON: %q", ep, body)
	case !valid && !re.Syntax:
		t.Fatalf("%v: invalid JSON %q refused as a type error: %v", ep, body, err)
	case valid && err != nil && re.Syntax:
		t.Fatalf("%v: valid JSON %q refused as malformed: %v", ep, body, err)
	case !valid:
		return
	}
	if len(feat.Blocks) > x.MaxBlocks() {
		t.Fatalf("%d blocks over the bound", len(feat.Blocks))
	}
	want, ok := reference(ep, body, x)
	if !ok {
		return // invalid UTF-8: encoding/json replaces it, Parse keeps the bytes
	}
	if (err == nil) != (want.typeErr == "") {
		t.Fatalf("%v: Parse(%q) = %v, reference type error %q", ep, body, err, want.typeErr)
	}
	if err != nil {
		return
	}
	if string(feat.Model) != want.model || string(feat.CacheSalt) != want.salt {
		t.Fatalf("%v: model %q salt %q, want %q %q (body %q)", ep, feat.Model, feat.CacheSalt, want.model, want.salt, body)
	}
	if feat.Stream != want.stream || (want.maxTokens < 1<<30 && feat.MaxTokens != want.maxTokens) {
		t.Fatalf("%v: stream %v max %d, want %v %d", ep, feat.Stream, feat.MaxTokens, want.stream, want.maxTokens)
	}
	for _, s := range []struct {
		name      string
		got, want []byte
	}{{"messages", feat.Messages.Bytes(body), want.messages}, {"tools", feat.Tools.Bytes(body), want.tools},
		{"prompt", feat.Prompt.Bytes(body), want.prompt}} {
		if !bytes.Equal(s.got, s.want) {
			t.Fatalf("%v: %s span %q, want %q", ep, s.name, s.got, s.want)
		}
	}
	if feat.Seed != want.seed {
		t.Fatalf("%v: seed differs", ep)
	}
	if len(feat.Blocks) != len(want.blocks) || feat.Truncated != want.truncated {
		t.Fatalf("%v: %d blocks (truncated %v), want %d (%v); stream %q", ep, len(feat.Blocks), feat.Truncated, len(want.blocks), want.truncated, want.stream_)
	}
	for i := range want.blocks {
		if feat.Blocks[i] != want.blocks[i] {
			t.Fatalf("%v: block %d differs; stream %q", ep, i, want.stream_)
		}
	}
	if !want.truncated && feat.PromptBytes != len(want.stream_) {
		t.Fatalf("%v: PromptBytes %d, want %d", ep, feat.PromptBytes, len(want.stream_))
	}
}

// refFeatures is what the reference decoding expects.
type refFeatures struct {
	typeErr                 string // the field a type error is about, "" for none
	model, salt             string
	stream                  bool
	maxTokens               int
	messages, tools, prompt []byte
	seed                    uint64
	stream_                 []byte // the canonical prompt
	blocks                  []uint64
	truncated               bool
}

// reference decodes body with encoding/json into generic values and builds
// the features Parse must produce, following Parse's documented rules.
// ok is false for bodies with invalid UTF-8 (encoding/json replaces it).
func reference(ep Endpoint, body []byte, x Extractor) (r refFeatures, ok bool) {
	if !utf8.Valid(body) {
		return r, false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil || top == nil {
		r.typeErr = "(not an object)"
		return r, true
	}
	isNull := func(v json.RawMessage) bool { return v == nil || string(v) == "null" }
	kind := func(v json.RawMessage) byte {
		if len(v) == 0 {
			return 0
		}
		return v[0]
	}
	strOf := func(v json.RawMessage) (string, bool) {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return "", false
		}
		return s, true
	}
	fail := func(name string) (refFeatures, bool) { r.typeErr = name; return r, true }

	if v := top["model"]; !isNull(v) {
		s, isStr := strOf(v)
		if !isStr {
			return fail("model")
		}
		r.model = s
	}
	llm := ep != EndpointUnknown
	r.maxTokens = 0
	if llm {
		if v := top["cache_salt"]; !isNull(v) {
			s, isStr := strOf(v)
			if !isStr {
				return fail("cache_salt")
			}
			r.salt = s
		}
		if v := top["stream"]; !isNull(v) {
			if string(v) != "true" && string(v) != "false" {
				return fail("stream")
			}
			r.stream = string(v) == "true"
		}
		set := false
		for _, k := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
			v := top[k]
			if isNull(v) {
				continue
			}
			n := 0
			for _, c := range v {
				if c < '0' || c > '9' {
					return fail(k)
				}
				if n < 1<<30 {
					n = n*10 + int(c-'0')
				}
			}
			if !set {
				r.maxTokens, set = n, true
			}
		}
		check := func(k string, kinds string) bool {
			v := top[k]
			return isNull(v) || strings.IndexByte(kinds, kind(v)) >= 0
		}
		switch ep {
		case EndpointChat:
			if !check("messages", "[") {
				return fail("messages")
			}
			if !check("tools", "[") {
				return fail("tools")
			}
		case EndpointCompletions:
			if !check("prompt", `"[`) {
				return fail("prompt")
			}
		case EndpointResponses:
			if !check("tools", "[") {
				return fail("tools")
			}
			if !check("input", `"[`) {
				return fail("input")
			}
			if !check("instructions", `"`) {
				return fail("instructions")
			}
		}
	}
	raw := func(k string) []byte {
		if v := top[k]; !isNull(v) {
			return v
		}
		return nil
	}
	var s []byte // the canonical stream
	compact := func(v []byte) {
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err != nil {
			panic(err)
		}
		s = append(s, buf.Bytes()...)
	}
	text := func(v []byte) {
		t, _ := strOf(v)
		s = append(s, t...)
	}
	messages := func(param string, v []byte) bool {
		var ms []json.RawMessage
		_ = json.Unmarshal(v, &ms)
		for _, mraw := range ms {
			var m map[string]json.RawMessage
			if kind(mraw) != '{' || json.Unmarshal(mraw, &m) != nil {
				r.typeErr = param
				return false
			}
			for _, k := range []string{"role", "name"} {
				if !isNull(m[k]) && kind(m[k]) != '"' {
					r.typeErr = param
					return false
				}
			}
			content := m["content"]
			if !isNull(content) && kind(content) != '"' && kind(content) != '[' {
				r.typeErr = param
				return false
			}
			s = append(s, sepMessage)
			if !isNull(m["role"]) {
				text(m["role"])
			}
			s = append(s, sepField)
			if !isNull(m["name"]) {
				text(m["name"])
			}
			s = append(s, sepField)
			switch kind(content) {
			case '"':
				if !isNull(content) {
					text(content)
				}
			case '[':
				var parts []json.RawMessage
				_ = json.Unmarshal(content, &parts)
				for _, p := range parts {
					s = append(s, sepField)
					if kind(p) == '"' {
						text(p)
						continue
					}
					var po map[string]json.RawMessage
					if kind(p) == '{' && json.Unmarshal(p, &po) == nil && kind(po["text"]) == '"' {
						text(po["text"])
						continue
					}
					s = binary.LittleEndian.AppendUint64(s, xxhash.Sum64(p))
				}
			}
			s = append(s, sepField)
			switch {
			case !isNull(m["tool_calls"]):
				compact(m["tool_calls"])
			case isNull(m["role"]) && isNull(content):
				compact(mraw)
			}
			s = append(s, sepField)
			switch {
			case !isNull(m["tool_call_id"]):
				compact(m["tool_call_id"])
			case !isNull(m["call_id"]):
				compact(m["call_id"])
			}
		}
		return true
	}
	switch ep {
	case EndpointChat:
		r.messages, r.tools = raw("messages"), raw("tools")
		if r.tools != nil {
			s = append(s, sepSection)
			compact(r.tools)
		}
		if r.messages != nil {
			s = append(s, sepSection)
			if !messages("messages", r.messages) {
				return r, true
			}
		}
	case EndpointCompletions:
		r.prompt = raw("prompt")
		switch kind(r.prompt) {
		case '"':
			text(r.prompt)
		case '[':
			var elems []json.RawMessage
			_ = json.Unmarshal(r.prompt, &elems)
			for _, e := range elems {
				if kind(e) == '"' {
					text(e)
					s = append(s, sepMessage)
					continue
				}
				compact(e)
				s = append(s, sepField)
			}
		}
	case EndpointResponses:
		r.tools = raw("tools")
		if r.tools != nil {
			s = append(s, sepSection)
			compact(r.tools)
		}
		if v := raw("instructions"); v != nil {
			s = append(s, sepSection, sepMessage)
			s = append(s, "system"...)
			s = append(s, sepField)
			text(v)
		}
		if v := raw("input"); v != nil {
			if kind(v) == '"' {
				s = append(s, sepMessage)
				s = append(s, "user"...)
				s = append(s, sepField)
				text(v)
			} else if !messages("input", v) {
				return r, true
			}
		}
	}
	r.stream_ = s
	r.seed = xxhash.Sum64([]byte(r.model + "\x00" + r.salt))
	prev := uint64(0)
	bb := x.blockBytes
	for len(s) >= bb && len(r.blocks) < x.maxBlocks {
		d := xxhash.NewWithSeed(prev)
		_, _ = d.Write(s[:bb])
		prev = d.Sum64()
		r.blocks = append(r.blocks, mixSeed(r.seed, prev))
		s = s[bb:]
	}
	r.truncated = len(r.blocks) == x.maxBlocks
	return r, true
}
