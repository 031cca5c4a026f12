package usage

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	chatJSONBody = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",
"choices":[{"index":0,"message":{"role":"assistant","content":"the \"usage\":{\"prompt_tokens\":999} is text"},"finish_reason":"stop"}],
"usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127,"prompt_tokens_details":{"cached_tokens":64}}}`

	chatSSEBody = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"usage\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":20,\"total_tokens\":320,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\n" +
		"data: [DONE]\n\n"

	continuousSSEBody = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":1}}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":2}}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n" +
		"data: [DONE]\n\n"

	responsesSSEBody = "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":900,\"input_tokens_details\":{\"cached_tokens\":512},\"output_tokens\":4,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":904}}}\n\n"

	// A broken event (unterminated string) must not hide the one after it.
	brokenSSEBody = "data: {\"choices\":[{\"delta\":{\"content\":\"unterminated}}]\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n"
)

func TestUsageScanner(t *testing.T) {
	tests := []struct {
		name   string
		give   string
		want   Usage
		wantOK bool
	}{
		{name: "chat json", give: chatJSONBody, want: Usage{PromptTokens: 120, CachedTokens: 64, CompletionTokens: 7}, wantOK: true},
		{name: "chat sse include_usage", give: chatSSEBody, want: Usage{PromptTokens: 300, CachedTokens: 256, CompletionTokens: 20}, wantOK: true},
		{name: "continuous usage stats takes the last", give: continuousSSEBody, want: Usage{PromptTokens: 50, CachedTokens: 32, CompletionTokens: 3}, wantOK: true},
		{name: "responses api", give: responsesSSEBody, want: Usage{PromptTokens: 900, CachedTokens: 512, CompletionTokens: 4}, wantOK: true},
		{name: "broken event then usage", give: brokenSSEBody, want: Usage{PromptTokens: 10, CompletionTokens: 1}, wantOK: true},
		{name: "no details", give: `{"usage":{"prompt_tokens":5,"completion_tokens":1}}`, want: Usage{PromptTokens: 5, CompletionTokens: 1, CachedUnreported: true}, wantOK: true},
		{name: "details null (vLLM's default)", give: `{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}`, want: Usage{PromptTokens: 5, CompletionTokens: 1, CachedUnreported: true}, wantOK: true},
		{name: "details without cached", give: `{"usage":{"input_tokens":5,"input_tokens_details":{}}}`, want: Usage{PromptTokens: 5, CachedUnreported: true}, wantOK: true},
		{name: "zero cached is a count", give: `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}`, want: Usage{PromptTokens: 5}, wantOK: true},
		{name: "pretty printed", give: "{\n  \"usage\" : {\n    \"prompt_tokens\": 8,\n    \"prompt_tokens_details\": {\"cached_tokens\": 9}\n  }\n}", want: Usage{PromptTokens: 8, CachedTokens: 8}, wantOK: true},
		{name: "stream without usage", give: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"},
		{name: "usage null", give: `{"id":"x","usage":null}`},
		{name: "usage in content only", give: `{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":3}"}}]}`},
		{name: "usage as a string value", give: `{"a":"usage","b":{"prompt_tokens":3}}`},
		{name: "error body", give: `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`},
		{name: "oversized usage ignored", give: `{"usage":{"prompt_tokens":1,"pad":"` + strings.Repeat("x", maxUsageBytes) + `"}}`},
		{name: "negative rejected", give: `{"usage":{"prompt_tokens":-1}}`},
		{name: "empty", give: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Whole, byte by byte, and in uneven chunks: the same answer.
			for _, step := range []int{len(tt.give) + 1, 1, 3, 17} {
				var s Scanner
				b := []byte(tt.give)
				for len(b) > 0 {
					n := min(step, len(b))
					s.Write(b[:n])
					b = b[n:]
				}
				got, ok := s.Result()
				if ok != tt.wantOK {
					t.Fatalf("step %d: ok = %v, want %v", step, ok, tt.wantOK)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("step %d: usage mismatch (-want +got):\n%s", step, diff)
				}
				if cap(s.cur) > 2*maxUsageBytes || cap(s.last) > 2*maxUsageBytes {
					t.Errorf("step %d: scanner kept %d+%d bytes", step, cap(s.cur), cap(s.last))
				}
			}
		})
	}
}

func TestUsageScannerReset(t *testing.T) {
	var s Scanner
	s.Write([]byte(chatJSONBody))
	s.Reset()
	if _, ok := s.Result(); ok {
		t.Fatal("Result after Reset reports usage")
	}
	s.Write([]byte(responsesSSEBody))
	got, ok := s.Result()
	if !ok || got.PromptTokens != 900 {
		t.Fatalf("after Reset: got %+v, %v", got, ok)
	}
}

func TestUsageScannerWriteAllocs(t *testing.T) {
	var s Scanner
	body := []byte(chatSSEBody)
	s.Write(body) // size the buffers
	allocs := testing.AllocsPerRun(100, func() { s.Write(body) })
	if allocs != 0 {
		t.Fatalf("Write allocates %v times per body", allocs)
	}
}

func FuzzUsageScanner(f *testing.F) {
	for _, s := range []string{chatJSONBody, chatSSEBody, continuousSSEBody, responsesSSEBody, brokenSSEBody, `{"usage":{`} {
		f.Add([]byte(s), 7)
	}
	f.Fuzz(func(t *testing.T, body []byte, step int) {
		if step <= 0 {
			step = 1
		}
		var whole, parts Scanner
		whole.Write(body)
		for b := body; len(b) > 0; {
			n := min(step, len(b))
			parts.Write(b[:n])
			b = b[n:]
		}
		u1, ok1 := whole.Result()
		u2, ok2 := parts.Result()
		if u1 != u2 || ok1 != ok2 {
			t.Fatalf("chunking changed the result: %+v %v vs %+v %v", u1, ok1, u2, ok2)
		}
		if ok1 && (u1.CachedTokens > u1.PromptTokens || u1.PromptTokens < 0) {
			t.Fatalf("inconsistent usage %+v", u1)
		}
		if cap(whole.cur) > 2*maxUsageBytes || cap(whole.last) > 2*maxUsageBytes {
			t.Fatalf("scanner grew to %d+%d bytes", cap(whole.cur), cap(whole.last))
		}
	})
}

func BenchmarkUsageScanner(b *testing.B) {
	benchScan(b, []byte(strings.Repeat("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello world\"}}],\"usage\":null}\n\n", 200)+chatSSEBody))
}

// BenchmarkUsageScannerAnswer is the scanner over one small non-streamed
// chat answer with its usage object, as the overhead bench's engine sends it.
func BenchmarkUsageScannerAnswer(b *testing.B) {
	benchScan(b, []byte(`{"id":"chatcmpl-1","object":"chat.completion","model":"qwen3-32b","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8}}}`))
}

// benchScan measures one Scanner over body, reset before each pass.
func benchScan(b *testing.B, body []byte) {
	var s Scanner
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset()
		s.Write(body)
	}
}

// FuzzIndexKey holds indexKey to bytes.Index(p, usageKey).
func FuzzIndexKey(f *testing.F) {
	for _, s := range []string{chatJSONBody, `"usage"`, `usage"`, `""usage"`, `x"usage`, `"usage""usage"`, `usage""usage"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		if got, want := indexKey(p), bytes.Index(p, usageKey); got != want {
			t.Fatalf("%q: indexKey %d, bytes.Index %d", p, got, want)
		}
	})
}

// TestUsageCached: an unreported cached count is -1 for Router.Observe
// (unknown), a reported one is itself, zero included.
func TestUsageCached(t *testing.T) {
	for _, tt := range []struct {
		give Usage
		want int
	}{
		{Usage{PromptTokens: 100, CachedTokens: 64}, 64},
		{Usage{PromptTokens: 100}, 0},
		{Usage{PromptTokens: 100, CachedUnreported: true}, -1},
	} {
		if got := tt.give.Cached(); got != tt.want {
			t.Errorf("%+v.Cached() = %d, want %d", tt.give, got, tt.want)
		}
	}
}
