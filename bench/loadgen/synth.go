package loadgen

import (
	"fmt"
	"strings"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// HistoryMode decides what a session's later turns carry as the assistant
// messages of earlier turns.
type HistoryMode string

const (
	// HistoryActual sends back the reply the engine actually streamed, as
	// a real chat client does. The engine's cached blocks of its own reply
	// then match the next turn's prompt. Same trace and a deterministic
	// engine give the same bytes.
	HistoryActual HistoryMode = "actual"
	// HistorySynthetic sends a deterministic stand-in rendered from the
	// trace's output tokens (workload.Synth.Completion), independent of the
	// engine: every request's bytes follow from the trace alone, but an
	// engine's cache of its own previous reply is not reused.
	HistorySynthetic HistoryMode = "synthetic"
)

// ParseHistoryMode parses "actual" or "synthetic".
func ParseHistoryMode(s string) (HistoryMode, error) {
	switch HistoryMode(s) {
	case HistoryActual, HistorySynthetic:
		return HistoryMode(s), nil
	}
	return "", fmt.Errorf("history mode %q: want actual or synthetic", s)
}

// pieceWords are the text pieces synthetic tokens are rendered as: a space
// and a three-letter English word, four bytes each. The engine simulator's
// tokenizer stand-in counts exactly one token per four bytes, and real BPE
// tokenizers (GPT, Llama, Qwen) mostly encode " the", " and"... as one
// token, so the rendered text keeps the trace's token counts close on both.
var pieceWords = strings.Fields(`
the and for are but not you all any can had her was one our out day get has
him his how man new now old see two way who boy did its let put say she too
use act add age ago aid aim air art ask bad bag bar bed bet big bit box bus
buy car cat cup cut dog dry due ear eat egg end eye fan far fat few fit fix
fly fun gas god gun guy hat hit hot ice ill job joy key kid lab law lay leg
lie lot low map mix mom net nor odd oil own pay pen per pet pie pop pot raw
red rid row run sad sea set sex sit six ski sky son sun tax tea ten tie tip
toe top toy try war wet win yes yet arm bid bow cap cow cry dig fee fog fur
gap gum hid hop hug jam jaw jet kit lap lid lip log mad mud nod nut oak opt
owe pad pan pin pit pub rag ram rat rib rod rub rug sip sir sum tab tag tan
tin tub van vet web wig wit zip ace ant ape bat bee bin bog bud bun cab cod
cog cub dam den dew dim dip dot dug elf elk elm fad fig fin fox gel gem gin
hen hog hub hum hut inn ion ivy jar jog jug keg lad lag lob lit mat mob mop
mug nap nib oar orb ore owl pal paw pea peg pig ply pod pry pun rim rip rot
sap saw sob sod sow spa spy sty tap tar tot tug urn vat vow wad wax wok yam
yak zoo`)

// pieceLen is the byte length of one rendered token.
const pieceLen = 4

// AppendText renders synthetic token ids as text, four bytes per token.
// The same ids always give the same bytes.
func AppendText(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		dst = append(dst, ' ')
		dst = append(dst, pieceWords[id%uint32(len(pieceWords))]...)
	}
	return dst
}

// AppendTextAt renders synthetic token ids as text for engines whose
// tokenizer is tok (engine.Tokenizer, the simulators' Options.Density):
// token i of ids becomes bytes [tok.Cut(i), tok.Cut(i+1)) of the text, so
// the text is exactly len(ids) of tok's tokens, token i of it a function
// of ids[i] and i alone: equal id prefixes give equal byte prefixes and
// equal engine tokens. A 4-byte piece is AppendText's word; other widths
// are a space and letters drawn from the id (a 1-byte piece is one
// letter). At the default density it is AppendText.
func AppendTextAt(dst []byte, ids []uint32, tok engine.Tokenizer) []byte {
	if tok.BytesPerToken() == pieceLen {
		return AppendText(dst, ids)
	}
	for i, id := range ids {
		w := tok.Cut(i+1) - tok.Cut(i)
		if w == pieceLen {
			dst = append(dst, ' ')
			dst = append(dst, pieceWords[id%uint32(len(pieceWords))]...)
			continue
		}
		if w > 1 {
			dst = append(dst, ' ')
			w--
		}
		x := uint64(id)*0x9E3779B97F4A7C15 + 1
		for range w {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			dst = append(dst, byte('a'+x%26))
		}
	}
	return dst
}

// Synthesizer turns trace rows into chat messages. It is a value and safe
// for concurrent use.
type Synthesizer struct {
	// Synth generates the token ids; its Salt separates runs.
	Synth workload.Synth
	// History decides what earlier assistant turns carry.
	History HistoryMode
	// Tokenizer is the engines' tokenizer stand-in (its Density): every
	// message's text is rendered at its density (AppendTextAt), so that a
	// row's n tokens are n tokens to the engine at any density. The zero
	// value is 4 bytes per token (AppendText).
	Tokenizer engine.Tokenizer
}

// Messages renders r's prompt as chat messages: the group's shared prefix
// as the system message, then for every earlier turn its user part and its
// assistant reply, then r's new user part (workload.Segments). history
// holds the session's earlier rows (history[k] is turn k); replies holds
// the replies the engine streamed for them, used in HistoryActual mode
// (a missing reply falls back to the synthetic stand-in).
func (s Synthesizer) Messages(history []workload.Request, replies []string, r workload.Request) ([]Message, error) {
	segs, err := workload.Segments(history, r)
	if err != nil {
		return nil, err
	}
	msgs := make([]Message, 0, len(segs))
	var ids []uint32
	var buf []byte
	turn := 0 // the earlier turn the next assistant segment belongs to
	for _, g := range segs {
		if g.Role == workload.RoleAssistant {
			if s.History == HistoryActual && turn < len(replies) {
				msgs = append(msgs, Message{Role: "assistant", Content: replies[turn]})
				turn++
				continue
			}
			turn++
		}
		ids = s.Synth.Tokens(ids[:0], r, g)
		buf = AppendTextAt(buf[:0], ids, s.Tokenizer)
		msgs = append(msgs, Message{Role: g.Role.String(), Content: string(buf)})
	}
	return msgs, nil
}
