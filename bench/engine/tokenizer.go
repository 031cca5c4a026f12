package engine

import (
	"encoding/binary"
	"fmt"
	"math"
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

// BytesPerToken is the tokenizer stand-in's default rate: each token covers
// up to 4 bytes of text, close to real BPE tokenizers on English and JSON.
// A Tokenizer with another Density cuts text at other rates.
const BytesPerToken = 4

// Tokenizer is the tokenizer stand-in at a content density: Density bytes
// of text per token, fractional allowed. Token i of a text covers its bytes
// [Cut(i), Cut(i+1)), Cut(i) = floor(i x Density), so a text of n bytes has
// ceil(n / Density) tokens, and each token's id is a hash of its bytes: the
// result is deterministic, and a text's tokens begin with those of every
// prefix of it cut at a token boundary. Real content is not 4 bytes per
// token (code, JSON and tool output about 2.5-3.5 with Qwen3's tokenizer,
// prose 4.2-5): engines at another density count other tokens for the same
// bytes. The zero value is the default, 4 bytes per token, and every
// package-level function (TokenizeText, RenderChat, SyntheticText...) is
// the zero Tokenizer's. A Tokenizer is a value, safe for concurrent use.
type Tokenizer struct {
	// Density is bytes per token, in [MinDensity, MaxDensity] (kept to
	// thousandths); 0 is BytesPerToken.
	Density float64
}

// The densities a Tokenizer accepts.
const (
	MinDensity = 1
	MaxDensity = 64
)

// Validate reports a Density out of range.
func (t Tokenizer) Validate() error {
	if t.Density != 0 && !(t.Density >= MinDensity && t.Density <= MaxDensity) {
		return fmt.Errorf("density %g bytes per token: want 0 (4) or [%d, %d]", t.Density, MinDensity, MaxDensity)
	}
	return nil
}

// milli is the density in thousandths of a byte per token, so that cuts are
// integer arithmetic (the same on every platform).
func (t Tokenizer) milli() int64 {
	if t.Density == 0 {
		return BytesPerToken * 1000
	}
	return int64(math.Round(t.Density * 1000))
}

// BytesPerToken is the density in effect (Density, or 4 for the zero value).
func (t Tokenizer) BytesPerToken() float64 { return float64(t.milli()) / 1000 }

// Cut is the byte offset where token i of a text begins: floor(i x Density).
func (t Tokenizer) Cut(i int) int { return int(int64(i) * t.milli() / 1000) }

// CountBytes is the number of tokens of a text of n bytes: ceil(n / Density).
func (t Tokenizer) CountBytes(n int) int {
	if n <= 0 {
		return 0
	}
	m := t.milli()
	return int((int64(n)*1000 + m - 1) / m)
}

// Count is len(t.Text(nil, text)) without the allocation.
func (t Tokenizer) Count(text string) int { return t.CountBytes(len(text)) }

// Text appends the tokens of text to dst: text is cut at Cut(1), Cut(2)...
// and each piece is hashed to an id. Special-token strings such as
// "<|im_start|>" inside text are ordinary text here (as with vLLM's
// default of not parsing special tokens in user content).
func (t Tokenizer) Text(dst []uint32, text string) []uint32 {
	m := t.milli()
	for i, at := int64(1), 0; at < len(text); i++ {
		end := min(int(i*m/1000), len(text))
		dst = append(dst, pieceID(text[at:end]))
		at = end
	}
	return dst
}

// TokenizeText appends the tokens of text to dst at the default density:
// text is cut into 4-byte pieces and each piece is hashed to an id, so the
// result is deterministic and a text of n bytes has ceil(n/4) tokens
// (Tokenizer.Text).
func TokenizeText(dst []uint32, text string) []uint32 { return Tokenizer{}.Text(dst, text) }

// CountTextTokens is len(TokenizeText(nil, text)) without the allocation.
func CountTextTokens(text string) int { return Tokenizer{}.Count(text) }

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
	return Tokenizer{}.RenderChat(dst, tools, msgs, addGenerationPrompt)
}

// RenderChat is the package's RenderChat with t's tokens: each message's
// role, body and separators are cut at t's density.
func (t Tokenizer) RenderChat(dst []uint32, tools []string, msgs []Message, addGenerationPrompt bool) []uint32 {
	i := 0
	if len(tools) > 0 || (len(msgs) > 0 && msgs[0].Role == "system") {
		sys := ""
		if len(msgs) > 0 && msgs[0].Role == "system" {
			sys = msgs[0].Content
			i = 1
		}
		dst = t.renderMessage(dst, "system", systemBody(sys, tools))
	}
	for ; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case "assistant":
			dst = t.renderMessage(dst, "assistant", AssistantBody(m.Content, m.ToolCalls))
		case "tool":
			dst = t.renderMessage(dst, "user", "<tool_response>\n"+m.Content+"\n</tool_response>")
		default:
			dst = t.renderMessage(dst, m.Role, m.Content)
		}
	}
	if addGenerationPrompt {
		dst = append(dst, TokenIMStart)
		dst = t.Text(dst, "assistant\n")
	}
	return dst
}

func (t Tokenizer) renderMessage(dst []uint32, role, body string) []uint32 {
	dst = append(dst, TokenIMStart)
	dst = t.Text(dst, role+"\n")
	dst = t.Text(dst, body)
	dst = append(dst, TokenIMEnd)
	return t.Text(dst, "\n")
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
func ReplyTokens(dst []uint32, body string) []uint32 { return Tokenizer{}.ReplyTokens(dst, body) }

// ReplyTokens is the package's ReplyTokens with t's tokens.
func (t Tokenizer) ReplyTokens(dst []uint32, body string) []uint32 {
	return append(t.Text(dst, body), TokenIMEnd)
}

// RenderPrompt appends the tokens of a plain completion prompt (no template).
func RenderPrompt(dst []uint32, prompt string) []uint32 { return Tokenizer{}.Text(dst, prompt) }

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
func SyntheticText(seed uint64, n int) string { return Tokenizer{}.SyntheticText(seed, n) }

// SyntheticText returns the package's SyntheticText text cut to t.Cut(n)
// bytes: exactly n of t's tokens. The text of n tokens is a prefix of the
// text of more tokens of the same seed.
func (t Tokenizer) SyntheticText(seed uint64, n int) string {
	if n <= 0 {
		return ""
	}
	want := t.Cut(n)
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
