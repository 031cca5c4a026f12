package usage

import (
	"testing"
)

// refResult is Result as it was before its fast path: the last usage
// object decoded with encoding/json only (the fast path is what differs;
// the mapping to Usage is the same code).
func refResult(s *Scanner) (u Usage, ok bool) {
	if len(s.last) == 0 {
		return Usage{}, false
	}
	var j usageJSON
	if !j.slow(s.last) {
		return Usage{}, false
	}
	return j.usage()
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
