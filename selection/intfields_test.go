package selection

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// intFieldsTest are the fields of intFieldsRef, the struct that
// json.Unmarshal decodes into as IntFields' reference.
var intFieldsTest = []IntField{
	{Name: "prompt_tokens"}, {Name: "completion_tokens"},
	{Parent: "prompt_tokens_details", Name: "cached_tokens"},
	{Name: "input_tokens"},
	{Parent: "input_tokens_details", Name: "cached_tokens"},
}

type intFieldsRef struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	PromptDetails    struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokens  int64 `json:"input_tokens"`
	InputDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

const intUnset = -7 // what out starts at: a field left as it is keeps it

// refIntFields decodes b with encoding/json.
func refIntFields(b []byte) ([]int64, error) {
	r := intFieldsRef{PromptTokens: intUnset, CompletionTokens: intUnset, InputTokens: intUnset}
	r.PromptDetails.CachedTokens, r.InputDetails.CachedTokens = intUnset, intUnset
	err := json.Unmarshal(b, &r)
	return []int64{r.PromptTokens, r.CompletionTokens, r.PromptDetails.CachedTokens, r.InputTokens, r.InputDetails.CachedTokens}, err
}

var intFieldSetTest = NewIntFieldSet(intFieldsTest)

// runIntFields runs IntFields and IntFieldSet.Ints on b and fails t when
// their answers differ.
func runIntFields(t *testing.T, b []byte) ([]int64, bool) {
	out := []int64{intUnset, intUnset, intUnset, intUnset, intUnset}
	ok := IntFields(b, intFieldsTest, out)
	out2 := []int64{intUnset, intUnset, intUnset, intUnset, intUnset}
	ok2 := intFieldSetTest.Ints(b, out2)
	if ok != ok2 || ok && !slices.Equal(out, out2) {
		t.Fatalf("%q: IntFields %v %v, IntFieldSet.Ints %v %v", b, out, ok, out2, ok2)
	}
	checkIntsObject(t, b, out, ok)
	return out, ok
}

// checkIntsObject holds IntFieldSet.IntsObject to Ints: over b's object
// (leading whitespace cut) followed by other bytes, a decided object must
// be one Ints decides alike over the bytes up to its end; and an object
// Ints decided (out, ok) must be decided there, ending where it ends.
func checkIntsObject(t *testing.T, b []byte, out []int64, ok bool) {
	t.Helper()
	trim := bytes.TrimLeft(b, " \t\r\n")
	for _, suffix := range []string{"", "}", `,"prompt_tokens":7}`, "\n\ndata: [DONE]", "]\"x\":1 ", "\x00\xff"} {
		buf := append(slices.Clip(trim), suffix...)
		got := []int64{intUnset, intUnset, intUnset, intUnset, intUnset}
		end, decided := intFieldSetTest.IntsObject(buf, got)
		if decided {
			want := []int64{intUnset, intUnset, intUnset, intUnset, intUnset}
			if end <= 0 || end > len(buf) || !intFieldSetTest.Ints(buf[:end], want) || !slices.Equal(got, want) {
				t.Fatalf("%q: IntsObject decided %v up to %d, Ints over those bytes %v", buf, got, end, want)
			}
		}
		if obj := bytes.TrimRight(trim, " \t\r\n"); ok && (!decided || end != len(obj) || !slices.Equal(got, out)) {
			t.Fatalf("%q: Ints decided %v; IntsObject %v, %v up to %d (the object is %d bytes)", buf, out, got, decided, end, len(obj))
		}
	}
}

func TestIntFields(t *testing.T) {
	tests := []struct {
		name        string
		give        string
		wantDecided bool
	}{
		{name: "vllm usage", give: `{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`, wantDecided: true},
		{name: "details null", give: `{"prompt_tokens":12,"total_tokens":13,"prompt_tokens_details":null}`, wantDecided: true},
		{name: "responses api", give: `{"input_tokens":900,"input_tokens_details":{"cached_tokens":512},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0}}`, wantDecided: true},
		{name: "whitespace and nesting in other members", give: " {\n \"x\" : [1, {\"y\": [true, false, null, \"s\\u00e9\"]}, -0.5e+3] , \"prompt_tokens\" : -0 }\t", wantDecided: true},
		{name: "case folded and duplicate keys, last wins", give: `{"Prompt_Tokens":1,"PROMPT_TOKENS":2,"prompt_tokens_details":{"cached_tokens":3},"prompt_tokens_details":{"CACHED_TOKENS":4}}`, wantDecided: true},
		{name: "kelvin sign folds to k", give: "{\"prompt_to\u212aens\":5}", wantDecided: true},
		{name: "long s folds to s", give: "{\"prompt_token\u017f\":6,\"input_to\u212aen\u017f\":7}", wantDecided: true},
		{name: "a longer ASCII key", give: `{"prompt_tokensx":6,"prompt_token":7}`, wantDecided: true},
		{name: "int64 bounds", give: `{"prompt_tokens":9223372036854775807,"completion_tokens":-9223372036854775808}`, wantDecided: true},
		{name: "null field", give: `{"prompt_tokens":null}`, wantDecided: true},
		{name: "empty object", give: `{}`, wantDecided: true},
		{name: "keys of 8, 16, 24 and more bytes", give: `{"abcdefgh":1,"abcdefghijklmnop":2,"abcdefghijklmnopqrstuvwx":3,"abcdefghijklmnopqrstuvwxyz_prompt_tokens":4,"prompt_tokens":5}`, wantDecided: true},
		{name: "non-ASCII keys as long as a name", give: "{\"prompt_toke\u00e9\":1,\"\u00e9rompt_token\":2,\"cached_tok\u00e9s\":3,\"prompt_tokens\":4}", wantDecided: true},
		{name: "kelvin sign in a parent", give: "{\"prompt_to\u212aens_details\":{\"cached_to\u212aens\":9}}", wantDecided: true},
		{name: "negative zero and a key at the end of a word", give: `{"completion_tokens":-0,"input_tokens":-12}`, wantDecided: true},
		{name: "unread members of every kind", give: `{"total_tokens":-1.5e-3,"a":0,"b":"\"","c":{},"d":[],"e":true,"prompt_tokens":3}`, wantDecided: true},
		// Left to encoding/json (which rejects or decodes them itself).
		{name: "escaped key", give: `{"prompt\u005ftokens":5}`},
		{name: "overflow", give: `{"prompt_tokens":9223372036854775808}`},
		{name: "fraction", give: `{"prompt_tokens":1.0}`},
		{name: "exponent", give: `{"prompt_tokens":1e2}`},
		{name: "string count", give: `{"prompt_tokens":"5"}`},
		{name: "bool count", give: `{"prompt_tokens":true}`},
		{name: "details not an object", give: `{"prompt_tokens_details":[1]}`},
		{name: "trailing comma", give: `{"prompt_tokens":1,}`},
		{name: "trailing data", give: `{"prompt_tokens":1} x`},
		{name: "not an object", give: `[1]`},
		{name: "unterminated", give: `{"prompt_tokens":1`},
		{name: "leading zero", give: `{"x":01}`},
		{name: "leading zero in a field", give: `{"prompt_tokens":01}`},
		{name: "minus alone", give: `{"prompt_tokens":-}`},
		{name: "minus alone in an unread member", give: `{"total_tokens":-}`},
		{name: "fraction without digits", give: `{"total_tokens":1.}`},
		{name: "number at the end", give: `{"prompt_tokens":12`},
		{name: "int64 overflow negative", give: `{"prompt_tokens":-9223372036854775809}`},
		{name: "many digits", give: `{"prompt_tokens":123456789012345678901234567890}`},
		{name: "unterminated long key", give: `{"prompt_tokens_details_and_more`},
		{name: "control character in a key", give: "{\"prompt\x01tokens\":1}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, decided := runIntFields(t, []byte(tt.give))
			if decided != tt.wantDecided {
				t.Fatalf("decided = %v, want %v", decided, tt.wantDecided)
			}
			want, err := refIntFields([]byte(tt.give))
			if decided {
				if err != nil {
					t.Fatalf("decided a body encoding/json rejects: %v", err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("values differ from encoding/json (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestIntFieldsAllocs(t *testing.T) {
	b := []byte(`{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`)
	out := make([]int64, len(intFieldsTest))
	if n := testing.AllocsPerRun(100, func() { IntFields(b, intFieldsTest, out) }); n != 0 {
		t.Fatalf("IntFields allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { intFieldSetTest.Ints(b, out) }); n != 0 {
		t.Fatalf("IntFieldSet.Ints allocates %v times", n)
	}
}

// FuzzIntFields holds IntFields to encoding/json: whatever it decides,
// json.Unmarshal accepts with the same values.
func FuzzIntFields(f *testing.F) {
	for _, s := range []string{
		`{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`,
		`{"input_tokens":900,"input_tokens_details":{"cached_tokens":512},"output_tokens":4}`,
		`{"Prompt_Tokens":1,"prompt_tokens_details":null,"x":[{"a":"\u00e9"}]}`,
		`{"prompt_tokens":-9223372036854775808}`, `{"prompt_tokens":1e2}`, `{"a":}`, ` { } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, decided := runIntFields(t, b)
		if !decided {
			return
		}
		want, err := refIntFields(b)
		if err != nil {
			t.Fatalf("IntFields decided %q, which encoding/json rejects: %v", b, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("%q: values differ from encoding/json (-want +got):\n%s", b, diff)
		}
	})
}

func BenchmarkIntFields(b *testing.B) {
	body := []byte(`{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}`)
	out := make([]int64, len(intFieldsTest))
	b.Run("IntFields", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			IntFields(body, intFieldsTest, out)
		}
	})
	b.Run("IntFieldSet", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			intFieldSetTest.Ints(body, out)
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = refIntFields(body)
		}
	})
}

// usageBenchFields are usage.usageFields (the module's list: both usage
// shapes, six fields).
var usageBenchFields = []IntField{
	{Name: "prompt_tokens"}, {Name: "completion_tokens"},
	{Parent: "prompt_tokens_details", Name: "cached_tokens"},
	{Name: "input_tokens"}, {Name: "output_tokens"},
	{Parent: "input_tokens_details", Name: "cached_tokens"},
}

// BenchmarkIntFieldsUsage is IntFields over the chat usage objects vLLM and
// SGLang send (about 150 bytes, with prompt_tokens_details), with the
// module's six fields; the per-op instruction count under callgrind is the
// yardstick (bench/RESULTS.md).
func BenchmarkIntFieldsUsage(b *testing.B) {
	for _, c := range []struct{ name, body string }{
		{"vllm", `{"prompt_tokens":1234,"total_tokens":1290,"completion_tokens":56,"prompt_tokens_details":{"cached_tokens":1024}}`},
		{"sglang", `{"prompt_tokens":1234,"total_tokens":1290,"completion_tokens":56,"prompt_tokens_details":{"cached_tokens":1024},"reasoning_tokens":0}`},
		{"responses", `{"input_tokens":1234,"input_tokens_details":{"cached_tokens":1024},"output_tokens":56,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1290}`},
	} {
		body := []byte(c.body)
		out := make([]int64, len(usageBenchFields))
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !IntFields(body, usageBenchFields, out) {
					b.Fatal("not decided")
				}
			}
		})
	}
}

// TestKeyFold: keyFold answers as bytes.EqualFold for keys shorter,
// longer and as long as the name, ASCII or not.
func TestKeyFold(t *testing.T) {
	keys := []string{"", "k", "K", "\u212a", "s", "\u017f", "ss", "cached_tokens", "CACHED_TOKENS", "cached_to\u212aens",
		"cached_token\u017f", "cached_tokenss", "cached_token", "cached_tokens\u00e9", "\u00e9ached_tokens",
		"cached_tok\u00e9s", "\u00e9ached_token", "Cached_Tokens", "xached_tokens", "prompt_to\u212aens_details", "prompt_tokens_detail\u017f"}
	names := []string{"k", "s", "cached_tokens", "prompt_tokens_details"}
	for _, k := range keys {
		for _, n := range names {
			if got, want := keyFold([]byte(k), n), bytes.EqualFold([]byte(k), []byte(n)); got != want {
				t.Errorf("keyFold(%q, %q) = %v, want %v", k, n, got, want)
			}
		}
	}
}
