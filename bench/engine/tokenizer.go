package engine

import (
	"encoding/binary"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Token ids of the tokenizer stand-in. Regular ids are in [0, VocabSize);
// the special tokens take Qwen's ids.
const (
	// VocabSize is the number of regular token ids (Qwen2/3's 151643).
	VocabSize = 151643
	// TokenEndOfText is <|endoftext|>.
	TokenEndOfText uint32 = 151643
	// TokenIMStart is <|im_start|>, which opens a chat message.
	TokenIMStart uint32 = 151644
	// TokenIMEnd is <|im_end|>, which closes a chat message; the engine
	// emits it as the last generated token of a chat reply.
	TokenIMEnd uint32 = 151645
)

// BytesPerToken is the tokenizer stand-in's rate: each token covers up to 4
// bytes of text, close to real BPE tokenizers on English and JSON.
const BytesPerToken = 4

// TokenizeText appends the tokens of text to dst. Text is cut into 4-byte
// pieces and each piece is hashed to an id, so the result is deterministic
// and a text of n bytes has ceil(n/4) tokens. Special-token strings such as
// "<|im_start|>" inside text are ordinary text here (as with vLLM's
// default of not parsing special tokens in user content).
func TokenizeText(dst []uint32, text string) []uint32 {
	for len(text) > 0 {
		n := min(len(text), BytesPerToken)
		dst = append(dst, pieceID(text[:n]))
		text = text[n:]
	}
	return dst
}

// CountTextTokens is len(TokenizeText(nil, text)) without the allocation.
func CountTextTokens(text string) int {
	return (len(text) + BytesPerToken - 1) / BytesPerToken
}

func pieceID(p string) uint32 {
	return uint32(xxhash.Sum64String(p) % VocabSize)
}

// ToolCall is one function call in an assistant message.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string // JSON text, as the client sends it back
}

// Message is one chat message as the chat template sees it.
type Message struct {
	// Role is system, user, assistant or tool.
	Role string
	// Content is the text content (text parts joined).
	Content string
	// ToolCalls are the assistant's function calls.
	ToolCalls []ToolCall
	// ToolCallID names the call a tool message answers.
	ToolCallID string
}

// RenderChat appends the tokens of a ChatML rendering (Qwen-style) of msgs
// to dst. tools are the raw JSON texts of the request's tool definitions;
// they are rendered into the system message (a system message is added when
// there is none). When addGenerationPrompt is set the rendering ends with
// the header of the assistant turn to be generated.
//
// Every message is rendered as <|im_start|>, the tokens of "role\n", the
// tokens of its body, <|im_end|>, the tokens of "\n". The body of an
// assistant message is AssistantBody(content, toolCalls), and its tokens
// followed by <|im_end|> are exactly what the engine generated for that
// reply (ReplyTokens), so turn N+1 begins with turn N's prompt plus its
// reply. Reasoning content is not rendered in history (Qwen3 drops it).
func RenderChat(dst []uint32, tools []string, msgs []Message, addGenerationPrompt bool) []uint32 {
	i := 0
	if len(tools) > 0 || (len(msgs) > 0 && msgs[0].Role == "system") {
		sys := ""
		if len(msgs) > 0 && msgs[0].Role == "system" {
			sys = msgs[0].Content
			i = 1
		}
		dst = renderMessage(dst, "system", systemBody(sys, tools))
	}
	for ; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case "assistant":
			dst = renderMessage(dst, "assistant", AssistantBody(m.Content, m.ToolCalls))
		case "tool":
			dst = renderMessage(dst, "user", "<tool_response>\n"+m.Content+"\n</tool_response>")
		default:
			dst = renderMessage(dst, m.Role, m.Content)
		}
	}
	if addGenerationPrompt {
		dst = append(dst, TokenIMStart)
		dst = TokenizeText(dst, "assistant\n")
	}
	return dst
}

func renderMessage(dst []uint32, role, body string) []uint32 {
	dst = append(dst, TokenIMStart)
	dst = TokenizeText(dst, role+"\n")
	dst = TokenizeText(dst, body)
	dst = append(dst, TokenIMEnd)
	return TokenizeText(dst, "\n")
}

func systemBody(sys string, tools []string) string {
	if len(tools) == 0 {
		return sys
	}
	var b strings.Builder
	if sys != "" {
		b.WriteString(sys)
		b.WriteString("\n\n")
	}
	b.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>")
	for _, t := range tools {
		b.WriteString("\n")
		b.WriteString(t)
	}
	b.WriteString("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.")
	return b.String()
}

// AssistantBody is the text of an assistant turn as the template renders
// it and as the engine generates it: the content followed by one
// <tool_call> block per call.
func AssistantBody(content string, calls []ToolCall) string {
	if len(calls) == 0 {
		return content
	}
	var b strings.Builder
	b.WriteString(content)
	for i, c := range calls {
		if i > 0 || content != "" {
			b.WriteString("\n")
		}
		b.WriteString(`<tool_call>` + "\n" + `{"name": "`)
		b.WriteString(c.Name)
		b.WriteString(`", "arguments": `)
		args := c.Arguments
		if args == "" {
			args = "{}"
		}
		b.WriteString(args)
		b.WriteString("}\n</tool_call>")
	}
	return b.String()
}

// ReplyTokens appends the tokens the engine generates for an assistant
// reply with the given body: the body's tokens and <|im_end|>.
func ReplyTokens(dst []uint32, body string) []uint32 {
	return append(TokenizeText(dst, body), TokenIMEnd)
}

// RenderPrompt appends the tokens of a plain completion prompt (no template).
func RenderPrompt(dst []uint32, prompt string) []uint32 {
	return TokenizeText(dst, prompt)
}

// SyntheticTokens appends n deterministic regular token ids derived from
// seed. Different seeds give unrelated sequences; the fleet simulation uses
// it to build prompts from numbers alone.
func SyntheticTokens(dst []uint32, seed uint64, n int) []uint32 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], seed)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint64(buf[8:], uint64(i))
		dst = append(dst, uint32(xxhash.Sum64(buf[:])%VocabSize))
	}
	return dst
}

var words = [...]string{
	"the", "model", "cache", "token", "block", "route", "agent", "tool",
	"value", "state", "query", "reply", "batch", "queue", "prefix", "load",
	"fast", "warm", "cold", "data", "plan", "step", "test", "code",
}

// SyntheticText returns deterministic English-like text derived from seed
// that tokenizes to exactly n tokens (4n bytes).
func SyntheticText(seed uint64, n int) string {
	if n <= 0 {
		return ""
	}
	want := n * BytesPerToken
	var b strings.Builder
	b.Grow(want + 8)
	x := seed*0x9E3779B97F4A7C15 + 1
	for b.Len() < want {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[x%uint64(len(words))])
	}
	s := b.String()[:want]
	return s
}
