package selection

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
)

func testConfig() Config {
	c := Config{BlockTokens: 4, PrefixTokens: 4 * 64, CharsPerToken: 4}
	c.SetDefaults()
	return c
}

func extract(t testing.TB, c Config, ep Endpoint, body string) *Features {
	t.Helper()
	x := NewExtractor(c)
	f := x.NewFeatures()
	if err := x.Parse(ep, []byte(body), f); err != nil {
		t.Fatalf("Extract(%s): %v", body, err)
	}
	return f
}

func chatBody(model string, msgs ...[2]string) string {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for _, m := range msgs {
		ms = append(ms, msg{m[0], m[1]})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": ms, "temperature": 0.2})
	return string(b)
}

func TestEndpointForPath(t *testing.T) {
	tests := []struct {
		give string
		want Endpoint
	}{
		{"/v1/chat/completions", EndpointChat},
		{"/openai/v1/chat/completions/", EndpointChat},
		{"/v1/completions", EndpointCompletions},
		{"/v1/responses", EndpointResponses},
		{"/v1/models", EndpointUnknown},
	}
	for _, tt := range tests {
		if got := EndpointForPath(tt.give); got != tt.want {
			t.Errorf("EndpointForPath(%q) = %v, want %v", tt.give, got, tt.want)
		}
	}
}

func TestExtractScalars(t *testing.T) {
	c := testConfig()
	f := extract(t, c, EndpointChat, `{"stream":true,"max_tokens":10,"max_completion_tokens":77,"cache_salt":"s1","messages":[{"role":"user","content":"hi"}],"model":"qwen3-32b","stream_options":{"include_usage":true}}`)
	if string(f.Model) != "qwen3-32b" || !f.Stream || f.MaxTokens != 77 || string(f.CacheSalt) != "s1" {
		t.Fatalf("got model=%q stream=%v max=%d salt=%q", f.Model, f.Stream, f.MaxTokens, f.CacheSalt)
	}
	f = extract(t, c, EndpointCompletions, `{"model":"m","prompt":"x","max_tokens":5}`)
	if f.MaxTokens != 5 || f.Stream {
		t.Fatalf("completions: max=%d stream=%v", f.MaxTokens, f.Stream)
	}
}

// Turn N+1 of a conversation must start with exactly the blocks of turn N,
// whatever the sampling fields and key order.
func TestExtractConversationPrefix(t *testing.T) {
	c := testConfig()
	sys := strings.Repeat("You are a careful coding agent. ", 20)
	turn1 := chatBody("m", [2]string{"system", sys}, [2]string{"user", "fix the bug in main.go please"})
	turn2 := `{"temperature":1,"messages":[{"content":` + mustJSON(sys) + `,"role":"system"},{"role":"user","content":"fix the bug in main.go please"},{"role":"assistant","content":"done: I changed line 3."},{"role":"user","content":"now add a test"}],"model":"m","max_tokens":100}`
	f1 := extract(t, c, EndpointChat, turn1)
	f2 := extract(t, c, EndpointChat, turn2)
	if len(f1.Blocks) < 10 || len(f2.Blocks) <= len(f1.Blocks) {
		t.Fatalf("blocks: turn1=%d turn2=%d", len(f1.Blocks), len(f2.Blocks))
	}
	if diff := cmp.Diff(f1.Blocks, f2.Blocks[:len(f1.Blocks)]); diff != "" {
		t.Fatalf("turn 2 does not start with turn 1 (-want +got):\n%s", diff)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestExtractCanonical(t *testing.T) {
	c := testConfig()
	long := strings.Repeat("abcdefgh", 40)
	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{"escapes decode alike", `{"model":"m","messages":[{"role":"user","content":"` + long + `é/"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"` + long + `\u00e9\/"}]}`, true},
		{"parts equal string", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + long + `"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"text":"` + long + `","type":"text"}]}]}`, true},
		{"whitespace in tools", `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"` + long + `"}]}`,
			`{"model":"m","tools": [ {"type": "function", "function": {"name": "f"}} ],"messages":[{"role":"user","content":"` + long + `"}]}`, true},
		{"model seeds", `{"model":"a","messages":[{"role":"user","content":"` + long + `"}]}`,
			`{"model":"b","messages":[{"role":"user","content":"` + long + `"}]}`, false},
		{"cache_salt seeds", `{"model":"a","messages":[{"role":"user","content":"` + long + `"}]}`,
			`{"model":"a","cache_salt":"t2","messages":[{"role":"user","content":"` + long + `"}]}`, false},
		{"tools change the prompt", `{"model":"m","tools":[{"name":"f"}],"messages":[{"role":"user","content":"` + long + `"}]}`,
			`{"model":"m","tools":[{"name":"g"}],"messages":[{"role":"user","content":"` + long + `"}]}`, false},
		{"role matters", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`,
			`{"model":"m","messages":[{"role":"system","content":"` + long + `"}]}`, false},
		{"image parts digested", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:1"}},{"type":"text","text":"` + long + `"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:2"}},{"type":"text","text":"` + long + `"}]}]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fa := extract(t, c, EndpointChat, tt.a)
			fb := extract(t, c, EndpointChat, tt.b)
			if len(fa.Blocks) == 0 {
				t.Fatal("no blocks")
			}
			same := fa.Blocks[0] == fb.Blocks[0]
			if same != tt.same {
				t.Fatalf("first blocks equal = %v, want %v", same, tt.same)
			}
		})
	}
}

func TestExtractCompletionsAndResponses(t *testing.T) {
	c := testConfig()
	long := strings.Repeat("the quick brown fox ", 30)
	f := extract(t, c, EndpointCompletions, `{"model":"m","prompt":"`+long+`"}`)
	if len(f.Blocks) != len(long)/16 {
		t.Fatalf("completions string: %d blocks, want %d", len(f.Blocks), len(long)/16)
	}
	g := extract(t, c, EndpointCompletions, `{"model":"m","prompt":["`+long+`"]}`)
	if diff := cmp.Diff(f.Blocks, g.Blocks); diff != "" {
		t.Fatalf("array of one string differs from the string (-want +got):\n%s", diff)
	}
	ids := extract(t, c, EndpointCompletions, `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]}`)
	if len(ids.Blocks) == 0 {
		t.Fatal("token-id prompt produced no blocks")
	}
	r1 := extract(t, c, EndpointResponses, `{"model":"m","instructions":"`+long+`","input":"hello"}`)
	r2 := extract(t, c, EndpointResponses, `{"model":"m","instructions":"`+long+`","input":[{"role":"user","content":"hello"},{"role":"assistant","content":"hi"}]}`)
	n := len(long) / 16
	if diff := cmp.Diff(r1.Blocks[:n-1], r2.Blocks[:n-1]); diff != "" {
		t.Fatalf("responses: instructions prefix differs (-want +got):\n%s", diff)
	}
}

func TestExtractPrefixBound(t *testing.T) {
	c := testConfig() // 64 blocks of 16 bytes
	long := strings.Repeat("x", 10000)
	f := extract(t, c, EndpointChat, chatBody("m", [2]string{"user", long}))
	if len(f.Blocks) != 64 || !f.Truncated {
		t.Fatalf("blocks=%d truncated=%v, want 64 true", len(f.Blocks), f.Truncated)
	}
	if f.PromptBytes < 10000 {
		t.Fatalf("PromptBytes=%d, want the whole prompt counted", f.PromptBytes)
	}
	if got := f.PromptTokens(c); got < 2500 {
		t.Fatalf("PromptTokens=%d", got)
	}
}

func TestExtractErrors(t *testing.T) {
	c := testConfig()
	tests := []struct {
		name, give string
		ep         Endpoint
		wantParam  string
		wantMsg    string
	}{
		{"empty", ``, EndpointChat, "", "JSON object"},
		{"not object", `[1]`, EndpointChat, "", "JSON object"},
		{"truncated", `{"model":"m","messages":[{"role":"user","content":"hi"}`, EndpointChat, "messages", "end of input"},
		{"trailing", `{"model":"m"} x`, EndpointChat, "", "after the JSON object"},
		{"bad literal", `{"model":"m","stream":tru}`, EndpointChat, "stream", "literal"},
		{"model type", `{"model":1}`, EndpointChat, "model", "model must be a string or null"},
		{"model type unknown endpoint", `{"model":[]}`, EndpointUnknown, "model", "a string"},
		{"messages type", `{"model":"m","messages":{}}`, EndpointChat, "messages", "messages must be an array"},
		{"messages string", `{"model":"m","messages":"hello"}`, EndpointChat, "messages", "an array"},
		{"message not object", `{"model":"m","messages":[{"role":"user"},"hi"]}`, EndpointChat, "messages.[1]", "an object"},
		{"role type", `{"model":"m","messages":[{"role":1,"content":"x"}]}`, EndpointChat, "messages.[0].role", "a string"},
		{"content type", `{"model":"m","messages":[{"role":"user","content":{}}]}`, EndpointChat, "messages.[0].content", "array of parts"},
		{"tools type", `{"model":"m","tools":{},"messages":[]}`, EndpointChat, "tools", "an array"},
		{"max_tokens type", `{"model":"m","max_tokens":1.5}`, EndpointChat, "max_tokens", "integer"},
		{"max_tokens negative", `{"model":"m","max_tokens":-1}`, EndpointChat, "max_tokens", "integer"},
		{"stream type", `{"model":"m","stream":"yes"}`, EndpointChat, "stream", "boolean"},
		{"bad escape", `{"model":"m","messages":[{"role":"user","content":"a\qb"}]}`, EndpointChat, "messages", "escape"},
		{"too deep", `{"model":"m","x":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`, EndpointChat, "", "nesting too deep"},
		{"prompt type", `{"model":"m","prompt":3}`, EndpointCompletions, "prompt", "a string or an array"},
		{"input type", `{"model":"m","input":3}`, EndpointResponses, "input", "a string or an array"},
		{"type error then syntax error", `{"model":1,"x":[}`, EndpointChat, "", "invalid character"},
	}
	x := NewExtractor(c)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := x.Parse(tt.ep, []byte(tt.give), x.NewFeatures())
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want *RequestError", err)
			}
			if re.Param != tt.wantParam || !strings.Contains(re.Msg, tt.wantMsg) {
				t.Fatalf("got param=%q msg=%q, want param=%q msg containing %q", re.Param, re.Msg, tt.wantParam, tt.wantMsg)
			}
		})
	}
}

// The scanner accepts what encoding/json accepts and rejects what it
// rejects, on a table of edge cases.
func TestScannerAgreesWithEncodingJSON(t *testing.T) {
	cases := []string{
		`{}`, `{"a":1}`, `{"a":-0.5e+3}`, `{"a":[1,2,{"b":null}]}`, `{"a":"\u00e9\ud83d\ude00"}`,
		`{"a":01}`, `{"a":1.}`, `{"a":-}`, `{"a" 1}`, `{"a":1,}`, `{"a":[1,]}`, `{,}`, `{"a":"\\"}`,
		`{"a":"\\\""}`, `{"a":truex}`, ` {"a":1} `, `{"a":1}}`, `{"a":[}`,
		`{"a":"\u00"}`, `{"a":"\ud800"}`, "{\"a\":\"\x01\"}", "{\"a\":\"\xff\"}", `{"a":1e}`, `{"a":-01}`,
		`{"a":[[[]]]}`, `{"a":{"b":{}}}`, `{"a" : [ 1 , 2 ] , "b" : { } }`, `{"a":nul}`, `{"a":"x"`, `{"a"`,
		`{"a":` + strings.Repeat("[", 300) + strings.Repeat("]", 300) + `}`,
		`{"a":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`,
		`{"a":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`,
		`{"a":` + strings.Repeat(`{"b":`, MaxDepth-1) + "1" + strings.Repeat("}", MaxDepth-1) + `}`,
		`{"a":` + strings.Repeat(`{"b":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth) + `}`,
	}
	x := NewExtractor(testConfig())
	for _, give := range cases {
		err := x.Parse(EndpointChat, []byte(give), x.NewFeatures())
		want := json.Valid([]byte(give))
		if (err == nil) != want {
			t.Errorf("%.80s: scanner err=%v, encoding/json valid=%v", give, err, want)
		}
	}
}

func TestHashTokenBlocks(t *testing.T) {
	toks := make([]uint32, 100)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	keys := AppendTokenBlocks(nil, 0, toks, 16)
	if len(keys) != 6 {
		t.Fatalf("%d keys, want 6 full blocks", len(keys))
	}
	if keys[1] != HashTokenBlock(keys[0], toks[16:32]) {
		t.Fatal("block 1 is not chained to block 0")
	}
	other := AppendTokenBlocks(nil, 1, toks, 16)
	if other[0] == keys[0] {
		t.Fatal("seed does not change the first key")
	}
}

func ExampleExtractor_Parse() {
	c := Config{}
	c.SetDefaults()
	x := NewExtractor(c)
	f := x.NewFeatures()
	body := `{"model":"qwen3-32b","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"hello"}]}`
	if err := x.Parse(EndpointChat, []byte(body), f); err != nil {
		panic(err)
	}
	fmt.Println(string(f.Model), f.Stream, f.MaxTokens, len(f.Blocks))
	// Output: qwen3-32b true 256 0
}

// The fingerprint does not depend on the key order of the body: tools
// after messages, model last (the OpenAI Python SDK's order) gives the
// blocks of the canonical order, which Parse hashes in one walk.
func TestParseKeyOrder(t *testing.T) {
	c := testConfig()
	long := strings.Repeat("abcdefgh", 40)
	msgs := `"messages":[{"role":"system","content":"` + long + `"},{"content":[{"type":"text","text":"` + long + `"}],"role":"user"}]`
	tools := `"tools":[{"type":"function","function":{"name":"f"}}]`
	a := extract(t, c, EndpointChat, `{"model":"m",`+tools+`,`+msgs+`}`)
	b := extract(t, c, EndpointChat, `{`+msgs+`,`+tools+`,"model":"m"}`)
	d := extract(t, c, EndpointChat, `{"\u006dodel":"\u006d",`+msgs+`,"tools":null,`+tools+`}`)
	if len(a.Blocks) < 10 {
		t.Fatalf("%d blocks", len(a.Blocks))
	}
	for _, g := range []*Features{b, d} {
		if diff := cmp.Diff(a.Blocks, g.Blocks); diff != "" || g.Seed != a.Seed || g.PromptBytes != a.PromptBytes {
			t.Fatalf("key order changes the fingerprint (-want +got):\n%s", diff)
		}
	}
}

// Model, keys and spans as the precise path and the guard use them.
func TestParseModelAndSpans(t *testing.T) {
	c := testConfig()
	body := `{"\u006dodel":"org\u002fm1","cache_salt":"s\u0031","messages":[{"role":"user","content":"hi"}],"tools":[ {"a":1} ]}`
	f := extract(t, c, EndpointChat, body)
	if string(f.Model) != "org/m1" || string(f.CacheSalt) != "s1" {
		t.Fatalf("model %q salt %q", f.Model, f.CacheSalt)
	}
	if got := string(f.Messages.Bytes([]byte(body))); got != `[{"role":"user","content":"hi"}]` {
		t.Errorf("messages span %q", got)
	}
	if got := string(f.Tools.Bytes([]byte(body))); got != `[ {"a":1} ]` {
		t.Errorf("tools span %q", got)
	}
	if f.Prompt != (Span{}) || f.Prompt.Bytes([]byte(body)) != nil {
		t.Errorf("prompt span %v on chat", f.Prompt)
	}
	p := extract(t, c, EndpointCompletions, `{"model":"m","prompt":"abc","messages":5}`)
	if string(p.Prompt.Bytes([]byte(`{"model":"m","prompt":"abc","messages":5}`))) != `"abc"` || p.Messages != (Span{}) {
		t.Errorf("completions spans %+v %+v", p.Prompt, p.Messages)
	}
	// The same name escaped and not seeds alike.
	g := extract(t, c, EndpointChat, `{"model":"org/m1","cache_salt":"s1","messages":[{"role":"user","content":"hi"}],"tools":[{"a":1}]}`)
	if g.Seed != f.Seed {
		t.Error("escaped model seeds differently")
	}
}

// knownKey's switch names every top-level field Parse reads, with its
// index in topKeys, and nothing else.
func TestKnownKey(t *testing.T) {
	for i, name := range topKeys {
		if got, gi := knownKey([]byte(name)); got != name || gi != i {
			t.Errorf("knownKey(%q) = %q, %d, want %q, %d", name, got, gi, name, i)
		}
		for _, other := range []string{name[1:], name + "s", strings.ToUpper(name), ""} {
			if got, gi := knownKey([]byte(other)); got != "" || gi != 0 {
				t.Errorf("knownKey(%q) = %q, %d, want none", other, got, gi)
			}
		}
	}
}

// seedOf is xxhash of model, a zero byte and salt, whatever their
// lengths (the stack copy and the streaming digest alike).
func TestSeedOf(t *testing.T) {
	for m := 0; m < 80; m += 3 {
		for s := 0; s < 80; s += 5 {
			model, salt := bytes.Repeat([]byte{'m'}, m), bytes.Repeat([]byte{'s'}, s)
			want := xxhash.Sum64(append(append(append([]byte{}, model...), 0), salt...))
			if got := seedOf(model, salt); got != want {
				t.Fatalf("seedOf(%d, %d bytes) = %x, want %x", m, s, got, want)
			}
		}
	}
}
