package enginesim

import (
	"encoding/binary"
	"encoding/json"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// output is the synthetic generation of one request: an optional reasoning
// region, a body (text or one tool call) and, for chat, <|im_end|>. Token i
// of a region covers its bytes [tok.Cut(i), tok.Cut(i+1)).
type output struct {
	think     string // "<think>\n" + reasoning + "\n</think>\n\n", or ""
	reasoning [2]int // byte range of the reasoning text inside think
	body      string
	call      *engine.ToolCall
	argsAt    [2]int // byte range of the arguments JSON inside body
	nameEnd   int    // body offset where the call's header is complete
	chat      bool
	tokens    []uint32
	tok       engine.Tokenizer
}

func (o *output) thinkTokens() int { return o.tok.Count(o.think) }

// total is the number of generated tokens.
func (o *output) total() int { return len(o.tokens) }

// bodyBytes is how many body bytes g generated tokens cover.
func (o *output) bodyBytes(g int) int {
	return min(o.tok.Cut(max(g-o.thinkTokens(), 0)), len(o.body))
}

// reasoningBytes is how many reasoning-text bytes g generated tokens cover.
func (o *output) reasoningBytes(g int) int {
	b := min(o.tok.Cut(g), len(o.think))
	return min(max(b-o.reasoning[0], 0), o.reasoning[1]-o.reasoning[0])
}

func (o *output) reasoningText() string { return o.think[o.reasoning[0]:o.reasoning[1]] }

// seedOf derives the output's seed from the prompt tokens, so the same
// request always gets the same output.
func seedOf(prompt []uint32) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [4]byte
	for _, t := range prompt {
		binary.LittleEndian.PutUint32(b[:], t)
		_, _ = d.Write(b[:])
	}
	return d.Sum64()
}

const (
	thinkOpen  = "<think>\n"
	thinkClose = "\n</think>\n\n"
)

// buildOutput plans about n generated tokens. For chat, the last token is
// <|im_end|>; reasoning takes about half when asked; a tool call is padded
// to fill its share. Tiny n may be exceeded by the fixed parts of a tool
// call or of the reasoning tags. Text is cut at tok's density.
func buildOutput(tok engine.Tokenizer, seed uint64, n int, chat, reasoning bool, call *engine.ToolCall, argKey string) *output {
	o := &output{chat: chat, tok: tok}
	bodyN := n
	if chat {
		bodyN = n - 1
	}
	if chat && reasoning {
		rt := max(bodyN/2-5, 1) // 5 tokens of tags
		text := tok.SyntheticText(seed^0x7468696e6b, rt)
		o.think = thinkOpen + text + thinkClose
		o.reasoning = [2]int{len(thinkOpen), len(thinkOpen) + len(text)}
		bodyN -= o.thinkTokens()
	}
	bodyN = max(bodyN, 1)
	if call != nil {
		c := *call
		prefix := engine.AssistantBody("", []engine.ToolCall{{Name: c.Name, Arguments: "\x00"}})
		cut := strings.IndexByte(prefix, 0)
		overhead := len(prefix) - 1 + len(`{"`+argKey+`": ""}`)
		valLen := max(tok.Cut(bodyN)-overhead, 1)
		val := tok.SyntheticText(seed, tok.CountBytes(valLen))[:valLen]
		args, _ := json.Marshal(map[string]string{argKey: val})
		c.Arguments = strings.Replace(string(args), `":"`, `": "`, 1)
		o.call = &c
		o.body = engine.AssistantBody("", []engine.ToolCall{c})
		o.argsAt = [2]int{cut, cut + len(c.Arguments)}
		o.nameEnd = cut
	} else {
		o.body = tok.SyntheticText(seed, bodyN)
	}
	o.tokens = tok.Text(o.tokens, o.think)
	if chat {
		o.tokens = tok.ReplyTokens(o.tokens, o.body)
	} else {
		o.tokens = tok.Text(o.tokens, o.body)
	}
	return o
}
