package usage

import (
	"encoding/json"
	"testing"
)

// refResult is Result as it was before its fast path: the last usage
// object decoded with encoding/json only.
func refResult(s *Scanner) (u Usage, ok bool) {
	if len(s.last) == 0 {
		return Usage{}, false
	}
	j := usageJSON{PromptTokens: absent, CompletionTokens: absent, InputTokens: absent, OutputTokens: absent}
	if err := json.Unmarshal(s.last, &j); err != nil {
		return Usage{}, false
	}
	orZero := func(n int64) int64 {
		if n == absent {
			return 0
		}
		return n
	}
	switch {
	case j.PromptTokens != absent:
		u.PromptTokens, u.CompletionTokens, u.CachedTokens = j.PromptTokens, orZero(j.CompletionTokens), j.PromptDetails.CachedTokens
	case j.InputTokens != absent:
		u.PromptTokens, u.CompletionTokens, u.CachedTokens = j.InputTokens, orZero(j.OutputTokens), j.InputDetails.CachedTokens
	default:
		return Usage{}, false
	}
	if u.PromptTokens < 0 || u.CachedTokens < 0 || u.CompletionTokens < 0 {
		return Usage{}, false
	}
	u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
	return u, true
}

var resultSeeds = []string{
	chatJSONBody, chatSSEBody, continuousSSEBody, responsesSSEBody, brokenSSEBody,
	`{"usage":{"prompt_tokens":5,"completion_tokens":1}}`,
	`{"usage":{"prompt_tokens":5,"prompt_tokens_details":null,"completion_tokens":null}}`,
	`{"usage":{"Prompt_Tokens":5,"prompt_tokens_details":{"Cached_Tokens":9}}}`,
	`{"usage":{"prompt\u005ftokens":5}}`, `{"usage":{"prompt_tokens":5.0}}`, `{"usage":{"prompt_tokens":"5"}}`,
	`{"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":-1}}}`,
	`{"usage":{"input_tokens":3,"output_tokens":null,"input_tokens_details":7}}`,
	`{"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":1}}`,
}

func TestResultMatchesEncodingJSON(t *testing.T) {
	for _, body := range resultSeeds {
		var s Scanner
		s.Write([]byte(body))
		got, ok := s.Result()
		want, wantOK := refResult(&s)
		if got != want || ok != wantOK {
			t.Errorf("%s: Result = %+v, %v; encoding/json: %+v, %v", body, got, ok, want, wantOK)
		}
	}
}

func TestResultAllocs(t *testing.T) {
	var s Scanner
	s.Write([]byte(chatJSONBody))
	if n := testing.AllocsPerRun(100, func() { s.Result() }); n != 0 {
		t.Fatalf("Result allocates %v times", n)
	}
}

// FuzzResult holds Result (selection.IntFields first, encoding/json when
// it does not decide) to the encoding/json decode it replaces, on bodies
// whose usage object the fuzzer varies.
func FuzzResult(f *testing.F) {
	for _, s := range resultSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var s Scanner
		s.Write(body)
		got, ok := s.Result()
		want, wantOK := refResult(&s)
		if got != want || ok != wantOK {
			t.Fatalf("%q: Result = %+v, %v; encoding/json: %+v, %v", body, got, ok, want, wantOK)
		}
	})
}
