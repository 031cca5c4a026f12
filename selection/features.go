package selection

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Endpoint is the OpenAI route a body was sent to; it decides where the
// prompt lives in the body.
type Endpoint uint8

const (
	// EndpointUnknown is any route ramjet does not fingerprint.
	EndpointUnknown Endpoint = iota
	// EndpointChat is POST /v1/chat/completions (messages, tools).
	EndpointChat
	// EndpointCompletions is POST /v1/completions (prompt).
	EndpointCompletions
	// EndpointResponses is POST /v1/responses (instructions, input, tools).
	EndpointResponses
)

func (e Endpoint) String() string {
	switch e {
	case EndpointChat:
		return "chat"
	case EndpointCompletions:
		return "completions"
	case EndpointResponses:
		return "responses"
	}
	return "unknown"
}

// EndpointForPath maps a request path to its Endpoint by suffix, so that
// both /v1/chat/completions and a prefixed /openai/v1/chat/completions work.
func EndpointForPath(path string) Endpoint {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return EndpointChat
	case strings.HasSuffix(path, "/completions"):
		return EndpointCompletions
	case strings.HasSuffix(path, "/responses"):
		return EndpointResponses
	}
	return EndpointUnknown
}

// Span is the position of one raw JSON value in a request body:
// body[Off:End]. The zero Span means the value is absent (or null).
type Span struct{ Off, End int32 }

// Bytes returns the raw value s spans in body (the body Parse read), or nil
// for the zero Span.
func (s Span) Bytes(body []byte) []byte {
	if s.End <= s.Off {
		return nil
	}
	return body[s.Off:s.End]
}

func spanOf(off, end int) Span { return Span{Off: int32(off), End: int32(end)} }

// Features is what routing needs from one request. Byte slices alias the
// body passed to Parse (or f's own buffer) and are valid only as long as
// the body is and until f is parsed into again.
type Features struct {
	Endpoint Endpoint
	// Model is the "model" string, escapes decoded ("a\u002fb" is a/b);
	// empty when absent or null.
	Model []byte
	// CacheSalt is the "cache_salt" string, escapes decoded, if any.
	CacheSalt []byte
	// Stream reports "stream": true.
	Stream bool
	// MaxTokens is the requested output length (max_completion_tokens,
	// max_tokens or max_output_tokens); 0 when not given.
	MaxTokens int
	// PromptBytes is the size of the whole canonical prompt in bytes (the
	// part past the fingerprinted prefix is estimated from raw lengths).
	PromptBytes int
	// Seed seeds the block chain: a hash of model and cache_salt.
	Seed uint64
	// Blocks are the chained block hashes of the bounded prompt prefix;
	// only full blocks count.
	Blocks []uint64
	// Truncated reports that the prompt was longer than the prefix bound.
	Truncated bool
	// Messages, Tools and Prompt are the raw JSON values of the fields of
	// those names, as sent (Span.Bytes), for code that forwards them (the
	// /tokenize preflight of the precise index). Messages is set for
	// EndpointChat, Tools for EndpointChat and EndpointResponses, Prompt for
	// EndpointCompletions; each is zero when the field is absent or null.
	Messages, Tools, Prompt Span

	// buf holds the decoded model and cache_salt when they have escapes.
	buf []byte
	// scratch is Parse's working state, kept so that a parse does not
	// zero a kilobyte of stack (the block buffer, the parts list) first.
	scratch *parseScratch
}

// parseScratch is the working state of one Parse, reused by the next:
// every field is set before it is read.
type parseScratch struct {
	k     blocker
	parts partList
}

// Reset clears f for reuse, keeping the capacity of Blocks.
func (f *Features) Reset() {
	*f = Features{Blocks: f.Blocks[:0], buf: f.buf[:0], scratch: f.scratch}
}

// FirstBlock is the hash the rendezvous tie-break uses: the first block, or
// the seed when the prompt is shorter than one block.
func (f *Features) FirstBlock() uint64 {
	if len(f.Blocks) > 0 {
		return f.Blocks[0]
	}
	return f.Seed
}

// PromptTokens estimates the prompt length in tokens.
func (f *Features) PromptTokens(c Config) int {
	return int(float64(f.PromptBytes) / c.CharsPerToken)
}

// Extractor parses request bodies into Features for one Config (the block
// size and the prefix bound of the fingerprint). It is a small comparable
// value, safe for concurrent use.
type Extractor struct {
	blockBytes int
	maxBlocks  int
}

// NewExtractor returns an Extractor for c (defaults must be set).
func NewExtractor(c Config) Extractor {
	return Extractor{blockBytes: c.blockBytes(), maxBlocks: c.maxBlocks()}
}

// MaxBlocks is the capacity Features.Blocks needs for Parse not to
// allocate.
func (x Extractor) MaxBlocks() int { return x.maxBlocks }

// NewFeatures returns Features whose Blocks can hold a full prefix.
func (x Extractor) NewFeatures() *Features {
	return &Features{Blocks: make([]uint64, 0, x.maxBlocks), buf: make([]byte, 0, 128), scratch: new(parseScratch)}
}

// blocker cuts the canonical prompt stream into fixed-size blocks and chains
// their hashes. It lives on the caller's stack. Bytes are gathered into buf
// until a block is complete and each block is hashed in one call,
// hashSeeded seeded by the previous block's hash (a block larger than buf
// goes through a digest in buf-sized chunks; a long string that starts a
// block is hashed where it lies, without a copy).
type blocker struct {
	d      xxhash.Digest // the current block when larger than buf
	prev   uint64        // the previous block's hash (0 before the first)
	bb     int           // block size
	max    int           // the bound, in blocks
	blocks []uint64
	total  int  // stream bytes (raw lengths past the bound)
	fill   int  // bytes gathered in buf
	chunk  int  // how many bytes buf gathers before they go to d (0 once done)
	part   int  // bytes of the current block already in d
	done   bool // max blocks hashed: later bytes are only counted
	// full reports the bound as the staging hasher before this one saw
	// it, so that PromptBytes (which counts raw lengths once full) stays
	// what it was: that hasher staged writes of up to 16 bytes in 128
	// and noticed the bound only when it handed them on. vn and vemit
	// replay its staging: bytes it would hold staged, bytes it would
	// have handed on.
	full  bool
	vn    int
	vemit int
	limit int // bb * max
	buf   [blockBuf]byte
}

// blockBuf is how many bytes blocker gathers before hashing: a whole
// block at the default geometry (64 tokens of 4 bytes).
const blockBuf = 512

// vstage is the staging capacity of the hasher whose bound blocker.full
// replays, and its largest staged write.
const (
	vstage    = 128
	vstageMax = 16
)

// reset starts an empty stream for x into blocks.
func (k *blocker) reset(x Extractor, blocks []uint64) {
	k.prev = 0
	k.bb, k.max, k.blocks = x.blockBytes, x.maxBlocks, blocks
	k.total, k.fill, k.part, k.done = 0, 0, 0, false
	k.chunk = min(k.bb, blockBuf)
	k.full, k.vn, k.vemit, k.limit = false, 0, 0, k.bb*k.max
}

// mixSeed binds the chained hash h of a block to the request's seed: a
// bijection of h for each seed (murmur3's finaliser over h xor the
// scrambled seed).
func mixSeed(seed, h uint64) uint64 {
	x := h ^ bits.RotateLeft64(seed*0x9E3779B97F4A7C15, 31)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// write appends p to the stream (stage and put, written out).
func (k *blocker) write(p []byte) {
	k.total += len(p)
	if len(p) <= vstageMax && k.vn+len(p) <= vstage {
		k.vn += len(p)
	} else {
		k.vspill(len(p))
	}
	if f := k.fill; f+len(p) < k.chunk {
		copy(k.buf[f:], p)
		k.fill = f + len(p)
		return
	}
	k.spill(p)
}

// stage replays the staging hasher taking a write of n bytes: staged
// when it is short and fits, else handed on (vspill). stage(1) is what
// it did with writeByte (128 bytes staged: handed on, the byte staged).
func (k *blocker) stage(n int) {
	if n <= vstageMax && k.vn+n <= vstage {
		k.vn += n
		return
	}
	k.vspill(n)
}

// put gathers the stream bytes p (total and stage are the caller's),
// hashing each chunk that fills.
func (k *blocker) put(p []byte) {
	if f := k.fill; f+len(p) < k.chunk {
		copy(k.buf[f:], p)
		k.fill = f + len(p)
		return
	}
	k.spill(p)
}

func (k *blocker) writeByte(c byte) {
	k.total++
	if k.vn == vstage {
		k.vspill(0)
	}
	k.vn++
	if f := k.fill; f+1 < k.chunk {
		k.buf[f] = c
		k.fill = f + 1
		return
	}
	k.spill([]byte{c})
}

// vspill replays the staging hasher handing its staged bytes on before a
// write of n bytes (which it stages when short, hands on when long).
func (k *blocker) vspill(n int) {
	k.vemit += k.vn
	k.vn = 0
	if n <= vstageMax {
		k.vn = n
	} else {
		k.vemit += n
	}
	if k.vemit >= k.limit {
		k.full = true
	}
}

// spill gathers p, hashing each chunk that fills.
func (k *blocker) spill(p []byte) {
	for len(p) > 0 && !k.done {
		if n := k.chunk; k.fill == 0 && len(p) >= n {
			c := p[:n]
			p = p[n:]
			k.hashChunk(c) // which may change chunk
			continue
		}
		n := copy(k.buf[k.fill:k.chunk], p)
		k.fill += n
		p = p[n:]
		if k.fill == k.chunk {
			k.fill = 0
			k.hashChunk(k.buf[:k.chunk])
		}
	}
}

// hashChunk hands c (the next k.chunk bytes of the stream) to the
// current block and closes the block when it is complete: a block that
// fits buf is hashed in one call (hashSeeded), a larger one through the
// digest, chunk by chunk.
func (k *blocker) hashChunk(c []byte) {
	var h uint64
	if k.part == 0 && len(c) == k.bb {
		h = hashSeeded(k.prev, c)
	} else {
		if k.part == 0 {
			k.d.ResetWithSeed(k.prev)
		}
		_, _ = k.d.Write(c)
		k.part += len(c)
		if k.part < k.bb {
			k.chunk = min(k.bb-k.part, blockBuf)
			return
		}
		h = k.d.Sum64()
		k.part = 0
		k.chunk = min(k.bb, blockBuf)
	}
	k.blocks = append(k.blocks, h)
	k.prev = h
	if len(k.blocks) >= k.max {
		k.done, k.chunk = true, 0
	}
}

// finish ends the stream: the bytes of an incomplete block are dropped.
func (k *blocker) finish() {
	k.vspill(0)
}

// writeString writes the body of a JSON string (without quotes), decoding
// escapes so that two encodings of the same text fingerprint alike.
func (k *blocker) writeString(raw []byte, escaped bool) {
	if k.full {
		k.total += len(raw)
		return
	}
	if !escaped {
		k.write(raw)
		return
	}
	unescapeTo(raw, k)
}

// writeCompact writes a valid JSON value with insignificant whitespace
// removed (strings kept as they are sent): the output of json.Compact.
func (k *blocker) writeCompact(b []byte) {
	if k.full {
		k.total += len(b)
		return
	}
	run, i := 0, 0
	for i < len(b) {
		c := b[i]
		if c == '"' {
			i, _ = laxString(b, i)
			continue
		}
		if isWS(c) {
			if i > run {
				k.write(b[run:i])
			}
			i = skipWS(b, i)
			run = i
			continue
		}
		i++
	}
	if run < len(b) {
		k.write(b[run:])
	}
}

// writeDigest writes an 8-byte digest of a raw JSON value, for parts that
// are not text (images, audio, files).
func (k *blocker) writeDigest(b []byte) {
	if k.full {
		k.total += len(b)
		return
	}
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], xxhash.Sum64(b))
	k.write(buf[:])
}

// Separators of the canonical stream; control characters that cannot
// appear unescaped in JSON strings' decoded text are rare enough.
const (
	sepSection = 0x1d // before tools, before messages
	sepMessage = 0x1e // before each message
	sepField   = 0x1f // between fields and parts of a message
)

// str is a string value found by the first pass.
type str struct {
	off, end int // the body, without quotes
	esc      bool
	set      bool
}

func (s str) raw(b []byte) []byte { return b[s.off:s.end] }

// Parse validates body (sent to ep) and reads it into f. It is ramjet's only
// JSON parser: the guard, the body matcher, the policy and the precise
// index all use its result, one parse per request.
//
// Parse accepts exactly the JSON that encoding/json accepts (nesting up to
// MaxDepth), and requires a top-level object. It reads "model" (a string or
// null) on every endpoint; on the three LLM endpoints also cache_salt (a
// string or null), stream (a boolean or null), max_tokens,
// max_completion_tokens and max_output_tokens (non-negative integers or
// null), and the prompt fields of the endpoint: messages and tools (arrays
// or null) for EndpointChat, prompt (a string, an array or null) for
// EndpointCompletions, instructions (a string or null), input (a string, an
// array or null) and tools for EndpointResponses; each message must be an
// object whose role and name are strings and whose content is a string, an
// array of parts or null. Keys are matched after decoding their escapes;
// of duplicate keys the last one counts, as in encoding/json maps and
// Python dicts. Other fields are validated as JSON and ignored.
//
// The prompt is fingerprinted in canonical order whatever the key order of
// the body (see the canonical stream below), into chained block hashes of
// the bounded prefix. On malformed JSON or a field of the wrong type Parse
// returns a *RequestError naming the problem and the field; f then holds
// no usable features.
//
// The canonical stream (what the block hashes cover; strings are decoded,
// "compact" is json.Compact of the value as sent):
//
//	chat:        [0x1d compact(tools)] [0x1d messages]
//	completions: prompt string, or per element: string 0x1e | compact 0x1f
//	responses:   [0x1d compact(tools)] [0x1d 0x1e "system" 0x1f instructions]
//	             then input: a string as 0x1e "user" 0x1f text, or messages
//	messages:    per message: 0x1e role 0x1f name 0x1f content 0x1f calls 0x1f id
//	content:     a string, or per part: 0x1f then the part's text (a string
//	             part, or an object's "text" string), else 8 bytes of
//	             xxhash of the raw part
//	calls:       compact(tool_calls); for an item with neither role nor
//	             content (a responses function_call), compact(the item)
//	id:          compact(tool_call_id), else compact(call_id)
//
// The seed is xxhash of model, a zero byte and cache_salt. The chain: h(i)
// is xxhash, seeded by h(i-1) (0 for block 0), of the i-th run of
// BlockBytes stream bytes; block i is mixSeed(seed, h(i)), so every block
// depends on the seed and on all the stream before it. Only full blocks
// count, at most MaxBlocks.
//
// Parse allocates nothing when f came from NewFeatures (or was parsed into
// before) and the model name has no escapes longer than f's buffer.
func (x Extractor) Parse(ep Endpoint, body []byte, f *Features) error {
	f.Reset()
	f.Endpoint = ep
	b := body
	if len(b) > math.MaxInt32 {
		return &RequestError{Msg: "request body larger than 2 GiB"}
	}
	i := skipWS(b, 0)
	if i >= len(b) {
		return syntaxErr(i, "empty request body: expected a JSON object")
	}
	if b[i] != '{' {
		end, err := skipValue(b, i, 0)
		if err != nil {
			return err
		}
		if j := skipWS(b, end); j != len(b) {
			return syntaxErr(j, "unexpected data after the JSON value")
		}
		return &RequestError{Msg: "the request body must be a JSON object", Offset: i}
	}
	var model, salt, instr str
	var input Span
	// The type error of each field's last occurrence (a later duplicate
	// overrides, as it does in encoding/json maps); syntax errors found
	// later win over all of them.
	var terrs [numKeys]error
	typed := false // some terrs entry was set to an error (else all are nil)
	maxTok, maxCompl, maxOut := -1, -1, -1
	llm := ep != EndpointUnknown
	var kbuf [24]byte

	// The block chain starts from 0 and is bound to the seed (model,
	// cache_salt) at the end (mixSeed), so that a chat body's tools and
	// messages are hashed during this one pass wherever the model is. When
	// the body has them in the canonical order (tools, if any, before
	// messages), messages are validated and hashed in one walk; otherwise
	// (tools after messages, duplicate keys) they are hashed again at the
	// end from their spans.
	if f.scratch == nil {
		f.scratch = new(parseScratch) // once for Features not from NewFeatures
	}
	k := &f.scratch.k
	k.reset(x, f.Blocks[:0])
	var toolsHashed, msgsHashed, redo bool
	it := newObjectIter(b, i, 1)
	for it.next() {
		v := it.val
		key, ki := knownKey(decodeKey(it.key, it.esc, &kbuf))
		var want string // what the value must be, for a type error
		switch {
		case key == "":
			it.skip()
			continue
		case key == "model" || llm && (key == "cache_salt" || key == "instructions" && ep == EndpointResponses):
			dst := &model // a string field
			switch key[0] {
			case 'c':
				dst = &salt
			case 'i':
				dst = &instr
			}
			*dst, want = str{}, "a string"
			if b[v] == '"' {
				end, esc, err := scanString(b, v)
				if err != nil {
					return inField(err, key)
				}
				*dst, terrs[ki] = str{v + 1, end - 1, esc, true}, nil
				it.i = end
				continue
			}
		case !llm:
			it.skip()
			continue
		case key == "stream":
			f.Stream, want = b[v] == 't', "a boolean"
			if b[v] == 't' || b[v] == 'f' {
				want = ""
			}
		case key == "max_tokens" || key == "max_completion_tokens" || key == "max_output_tokens":
			dst := &maxOut
			switch key[4] {
			case 't':
				dst = &maxTok
			case 'c':
				dst = &maxCompl
			}
			end, err := scanNumber2(b, v)
			if err != nil {
				return inField(err, key)
			}
			if end > 0 {
				n, ok := parseUint(b[v:end])
				terrs[ki] = nil
				if !ok {
					n, terrs[ki], typed = -1, typeErr(key, v, "a non-negative integer or null"), true
				}
				*dst = n
				it.i = end
				continue
			}
			*dst, want = -1, "a non-negative integer"
		case key == "messages" && ep == EndpointChat:
			f.Messages, want = Span{}, "an array"
			redo = redo || msgsHashed
			if b[v] == '[' {
				want = ""
				if !redo {
					k.writeByte(sepSection)
					end, err := walkMessages(k, b, v, "messages", &f.scratch.parts)
					if re, ok := err.(*RequestError); ok && re.Syntax {
						return inField(err, key)
					}
					terrs[ki], f.Messages, msgsHashed = err, spanOf(v, end), true
					typed = typed || err != nil
					it.i = end
					continue
				}
			}
		case key == "tools" && ep == EndpointChat:
			f.Tools, want = Span{}, "an array"
			redo = redo || msgsHashed || toolsHashed
			if b[v] == '[' {
				want = ""
				if !redo {
					end, err := skipValue(b, v, 1)
					if err != nil {
						return inField(err, key)
					}
					terrs[ki], f.Tools, toolsHashed = nil, spanOf(v, end), true
					k.writeByte(sepSection)
					k.writeCompact(b[v:end])
					it.i = end
					continue
				}
			}
		case key == "tools" && ep == EndpointResponses:
			f.Tools, want = Span{}, "an array"
			if b[v] == '[' {
				want = ""
			}
		case key == "prompt" && ep == EndpointCompletions:
			f.Prompt, want = Span{}, "a string or an array"
			if b[v] == '[' || b[v] == '"' {
				want = ""
			}
		case key == "input" && ep == EndpointResponses:
			input, want = Span{}, "a string or an array"
			if b[v] == '[' || b[v] == '"' {
				want = ""
			}
		default:
			it.skip()
			continue
		}
		end, err := skipValue(b, v, 1)
		if err != nil {
			return inField(err, key)
		}
		it.i = end
		terrs[ki] = nil
		switch {
		case want == "":
			switch key {
			case "messages":
				f.Messages = spanOf(v, end)
			case "tools":
				f.Tools = spanOf(v, end)
			case "prompt":
				f.Prompt = spanOf(v, end)
			case "input":
				input = spanOf(v, end)
			}
		case b[v] == 'n':
			// null: absent
		default:
			terrs[ki], typed = typeErr(key, v, want+" or null"), true
		}
	}
	if it.err != nil {
		return it.err
	}
	if j := skipWS(b, it.end); j != len(b) {
		return syntaxErr(j, "unexpected data after the JSON object")
	}
	for i := 0; typed && i < len(terrs); i++ {
		if err := terrs[i]; err != nil {
			return err
		}
	}
	switch {
	case maxCompl >= 0:
		f.MaxTokens = maxCompl
	case maxTok >= 0:
		f.MaxTokens = maxTok
	case maxOut >= 0:
		f.MaxTokens = maxOut
	}
	f.buf = f.buf[:0]
	f.Model = f.decoded(b, model)
	f.CacheSalt = f.decoded(b, salt)

	// The seed: model, then cache_salt. A LoRA adapter is addressed by its
	// model name in vLLM and SGLang, so the model covers it.
	f.Seed = seedOf(f.Model, f.CacheSalt)

	// The second pass: the prompt fields of a body known valid, in
	// canonical order, checking the types inside messages.
	var err error
	switch ep {
	case EndpointChat:
		if !redo {
			break // hashed in the first pass
		}
		k.reset(x, f.Blocks[:0])
		if f.Tools != (Span{}) {
			k.writeByte(sepSection)
			k.writeCompact(f.Tools.Bytes(b))
		}
		if f.Messages != (Span{}) {
			k.writeByte(sepSection)
			err = writeMessages(k, b, int(f.Messages.Off), "messages")
		}
	case EndpointCompletions:
		if f.Prompt != (Span{}) {
			writePrompt(k, b, int(f.Prompt.Off))
		}
	case EndpointResponses:
		if f.Tools != (Span{}) {
			k.writeByte(sepSection)
			k.writeCompact(f.Tools.Bytes(b))
		}
		if instr.set {
			k.writeByte(sepSection)
			writeTextMessage(k, "system", b, instr)
		}
		if input != (Span{}) {
			if v := int(input.Off); b[v] == '"' {
				end, esc := laxString(b, v)
				writeTextMessage(k, "user", b, str{v + 1, end - 1, esc, true})
			} else {
				err = writeMessages(k, b, v, "input")
			}
		}
	}
	k.finish()
	for i, h := range k.blocks {
		k.blocks[i] = mixSeed(f.Seed, h)
	}
	f.Blocks = k.blocks
	f.PromptBytes = k.total
	f.Truncated = k.full
	return err
}

// seedOf is the seed of a prompt's block chain: xxhash of model, a zero
// byte and salt, in one call over a copy on the stack when they fit (a
// streaming digest costs several times that for a short model name).
func seedOf(model, salt []byte) uint64 {
	var buf [64]byte
	if n := len(model) + 1 + len(salt); n <= len(buf) {
		copy(buf[:], model)
		copy(buf[len(model)+1:], salt)
		return xxhash.Sum64(buf[:n])
	}
	var d xxhash.Digest
	d.Reset()
	_, _ = d.Write(model)
	_, _ = d.Write([]byte{0})
	_, _ = d.Write(salt)
	return d.Sum64()
}

// topKeys are the top-level fields Parse reads.
var topKeys = [...]string{"model", "cache_salt", "stream", "max_tokens", "max_completion_tokens",
	"max_output_tokens", "messages", "tools", "prompt", "input", "instructions"}

const numKeys = len(topKeys)

// knownKey returns the name of a top-level field Parse reads (the constant
// of topKeys, so that errors keep it without allocating) and its index, or
// "" and 0.
func knownKey(k []byte) (string, int) {
	i := -1
	switch string(k) { // one jump on the length, then one comparison
	case "model":
		i = 0
	case "cache_salt":
		i = 1
	case "stream":
		i = 2
	case "max_tokens":
		i = 3
	case "max_completion_tokens":
		i = 4
	case "max_output_tokens":
		i = 5
	case "messages":
		i = 6
	case "tools":
		i = 7
	case "prompt":
		i = 8
	case "input":
		i = 9
	case "instructions":
		i = 10
	}
	if i < 0 {
		return "", 0
	}
	return topKeys[i], i
}

// decoded returns the string s of b with its escapes decoded (into f.buf
// when it has any), or nil when s is not set.
func (f *Features) decoded(b []byte, s str) []byte {
	if !s.set {
		return nil
	}
	if !s.esc {
		return s.raw(b)
	}
	start := len(f.buf)
	raw := s.raw(b)
	var e [utf8.UTFMax]byte
	for len(raw) > 0 {
		k := bytes.IndexByte(raw, '\\')
		if k < 0 {
			f.buf = append(f.buf, raw...)
			break
		}
		f.buf = append(f.buf, raw[:k]...)
		d, n := escape1(raw[k:], &e)
		f.buf = append(f.buf, d...)
		raw = raw[k+n:]
	}
	return f.buf[start:len(f.buf):len(f.buf)]
}

// scanNumber2 validates the value at b[v]: a number returns its end; null
// (or any other valid value) returns 0 after validation, with the
// caller left to skip it.
func scanNumber2(b []byte, v int) (int, error) {
	if c := b[v]; c == '-' || (c >= '0' && c <= '9') {
		return scanNumber(b, v)
	}
	return 0, nil
}

// parseUint parses a valid JSON number that must be a non-negative
// integer, capped at 1<<30.
func parseUint(num []byte) (int, bool) {
	n := 0
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n < 1<<30 {
			n = n*10 + int(c-'0')
		}
	}
	return n, true
}

func writeTextMessage(k *blocker, role string, b []byte, s str) {
	k.writeByte(sepMessage)
	k.write([]byte(role))
	k.writeByte(sepField)
	k.writeString(s.raw(b), s.esc)
}

// laxObj walks the members of an object of a body already validated; same
// protocol as objectIter, no errors.
type laxObj struct {
	b   []byte
	i   int
	key []byte // raw; see decodeKey
	esc bool
	val int
	end int
}

func newLaxObj(b []byte, i int) laxObj { return laxObj{b: b, i: skipWS(b, i+1)} }

// laxElem steps past the separator before a member or element at b[i:]
// (a validated body) and reports whether one follows before closer.
func laxElem(b []byte, i int, closer byte) (int, bool) {
	i = skipWS(b, i)
	if b[i] == ',' {
		i = skipWS(b, i+1)
	}
	return i, b[i] != closer
}

func (o *laxObj) next() bool {
	b := o.b
	i, ok := laxElem(b, o.i, '}')
	if !ok {
		o.end = i + 1
		return false
	}
	kend, esc := laxString(b, i)
	o.key, o.esc = b[i+1:kend-1], esc
	o.val = skipWS(b, skipWS(b, kend)+1)
	return true
}

// laxArr walks the elements of an array of a body already validated.
type laxArr struct {
	b   []byte
	i   int
	n   int // index of the current element
	val int
}

func newLaxArr(b []byte, i int) laxArr { return laxArr{b: b, i: i + 1, n: -1} }

func (a *laxArr) next() bool {
	i, ok := laxElem(a.b, a.i, ']')
	if !ok {
		a.i = i + 1
		return false
	}
	a.val = i
	a.n++
	return true
}

// elemParam is the OpenAI-style path of a message field, for errors.
func elemParam(param string, n int, field string) string {
	p := fmt.Sprintf("%s.[%d]", param, n)
	if field != "" {
		p += "." + field
	}
	return p
}

// writeMessages walks a messages (or responses input) array at b[v] == '['
// of a validated body. Each message is written as: sepMessage role sepField
// name sepField content sepField tool_calls sepField tool_call_id, whatever
// the key order in the body, so that a conversation's turn N+1 starts with
// turn N. Past the prefix bound the rest is only checked and counted.
func writeMessages(k *blocker, b []byte, v int, param string) error {
	var kbuf [24]byte
	arr := newLaxArr(b, v)
	for arr.next() {
		m := arr.val
		if b[m] != '{' {
			return typeErr(elemParam(param, arr.n, ""), m, "an object")
		}
		var msg msgFields
		obj := newLaxObj(b, m)
		for obj.next() {
			key := decodeKey(obj.key, obj.esc, &kbuf)
			val := obj.val
			c := b[val]
			var end int
			esc := false
			if c == '"' {
				end, esc = laxString(b, val)
			} else {
				end = laxSkip(b, val)
			}
			obj.i = end
			if want := msg.set(key, c, val, end, esc); want != "" {
				return typeErr(elemParam(param, arr.n, string(key)), val, want)
			}
		}
		arr.i = obj.end
		writeMessage(k, b, b[m:obj.end], &msg, nil)
	}
	return nil
}

// arrayIter walks the elements of an array, validating its syntax (the
// elements are the caller's to consume); same protocol as objectIter.
type arrayIter struct {
	b     []byte
	i     int
	n     int // index of the current element
	first bool
	val   int
	end   int
	err   error
}

// msgFields are the fields of one message that writeMessage hashes, as
// the two message walkers read them.
type msgFields struct {
	role, name, content                str
	contentArr, calls, callID, callID2 Span
}

// set notes the value at b[val:end] (c is b[val]; esc: a string with
// escapes) of the message's key, when writeMessage reads that key. It
// returns what the value should have been when its type is wrong ("" when
// it is right); the walkers turn that into the request's type error.
func (msg *msgFields) set(key []byte, c byte, val, end int, esc bool) (want string) {
	switch string(key) {
	case "role", "name":
		s := str{val + 1, end - 1, esc, true}
		switch c {
		case '"':
		case 'n':
			s = str{}
		default:
			want = "a string"
		}
		if key[0] == 'r' {
			msg.role = s
		} else {
			msg.name = s
		}
	case "content":
		msg.content, msg.contentArr = str{}, Span{}
		switch c {
		case '"':
			msg.content = str{val + 1, end - 1, esc, true}
		case '[':
			msg.contentArr = spanOf(val, end)
		case 'n':
		default:
			want = "a string, an array of parts or null"
		}
	case "tool_calls":
		msg.calls = nonNull(c, val, end)
	case "tool_call_id":
		msg.callID = nonNull(c, val, end)
	case "call_id":
		msg.callID2 = nonNull(c, val, end)
	}
	return want
}

// nonNull is the span of the value at val, or none for a null (c == 'n').
func nonNull(c byte, val, end int) Span {
	if c == 'n' {
		return Span{}
	}
	return spanOf(val, end)
}

// writeMessage writes one message's canonical bytes: role, name, content
// (text, or its parts: from parts when it holds this message's, else read
// again from the body), the tool calls or, for an item with neither role
// nor content (a responses function_call or function_call_output), the
// whole item, and the tool call id (tool_call_id, else call_id). The two
// message walkers share it, so that both paths hash alike.
func writeMessage(k *blocker, b, item []byte, msg *msgFields, parts *partList) {
	role, name, content, contentArr := msg.role, msg.name, msg.content, msg.contentArr
	calls, callID := msg.calls, msg.callID
	k.writeByte(sepMessage)
	if role.set {
		k.writeString(role.raw(b), role.esc)
	}
	k.writeByte(sepField)
	if name.set {
		k.writeString(name.raw(b), name.esc)
	}
	k.writeByte(sepField)
	switch {
	case content.set:
		k.writeString(content.raw(b), content.esc)
	case contentArr != (Span{}) && parts != nil && parts.ok && parts.at == contentArr.Off:
		parts.write(k, b)
	case contentArr != (Span{}):
		writeParts(k, b, int(contentArr.Off))
	}
	k.writeByte(sepField)
	switch {
	case calls != (Span{}):
		k.writeCompact(calls.Bytes(b))
	case !role.set && !content.set && contentArr == (Span{}):
		k.writeCompact(item)
	}
	k.writeByte(sepField)
	if callID == (Span{}) {
		callID = msg.callID2
	}
	if callID != (Span{}) {
		k.writeCompact(callID.Bytes(b))
	}
}

func newArrayIter(b []byte, i int) arrayIter { return arrayIter{b: b, i: i + 1, n: -1, first: true} }

func (a *arrayIter) next() bool {
	b := a.b
	i := skipWS(b, a.i)
	if i >= len(b) {
		a.err = syntaxErr(i, "unexpected end of input in array")
		return false
	}
	if b[i] == ']' {
		a.end = i + 1
		return false
	}
	if !a.first {
		if b[i] != ',' {
			a.err = syntaxErr(i, "expected ',' or ']' after array element")
			return false
		}
		if i = skipWS(b, i+1); i >= len(b) {
			a.err = syntaxErr(i, "unexpected end of input in array")
			return false
		}
	}
	a.first = false
	a.val = i
	a.n++
	return true
}

// walkMessages is writeMessages over a body not yet validated: it
// validates the messages array at b[v] == '[' (nesting depth 1) while it
// hashes it, in one walk. It returns the end of the array and a syntax
// error, or the first type error (after validating the whole array).
func walkMessages(k *blocker, b []byte, v int, param string, parts *partList) (int, error) {
	var kbuf [24]byte
	var terr error
	parts.at = 0                  // reused: at tells whose parts it holds
	obj := newObjectIter(b, v, 3) // reused for each message (restart)
	arr := newArrayIter(b, v)
	for arr.next() {
		m := arr.val
		if b[m] != '{' {
			end, err := skipValue(b, m, 2)
			if err != nil {
				return 0, err
			}
			if terr == nil {
				terr = typeErr(elemParam(param, arr.n, ""), m, "an object")
			}
			arr.i = end
			continue
		}
		var msg msgFields
		obj.restart(m)
		for obj.next() {
			key := decodeKey(obj.key, obj.esc, &kbuf)
			val := obj.val
			c := b[val]
			var end int
			esc := false
			var err error
			switch {
			case c == '"':
				end, esc, err = scanString(b, val)
			case c == '[' && string(key) == "content":
				// Validated once, its parts noted for writing below.
				end, err = parts.walk(b, val)
			default:
				end, err = skipValue(b, val, 3)
			}
			if err != nil {
				return 0, err
			}
			obj.i = end
			if want := msg.set(key, c, val, end, esc); want != "" && terr == nil {
				terr = typeErr(elemParam(param, arr.n, string(key)), val, want)
			}
		}
		if obj.err != nil {
			return 0, obj.err
		}
		arr.i = obj.end
		if terr != nil {
			continue // the features are refused: only validate the rest
		}
		writeMessage(k, b, b[m:obj.end], &msg, parts)
	}
	if arr.err != nil {
		return 0, arr.err
	}
	return arr.end, terr
}

// partList notes what writeParts would write for a content array while
// walk validates it, so that a message's parts are read once: up to 8
// parts (more, and writeParts walks the array again).
type partList struct {
	at   int32 // offset of the array
	ok   bool  // the parts fit
	n    int
	part [8]struct {
		text     str  // the part's text, when set
		off, end int  // the raw part, for a digest
		isText   bool // text is set
	}
}

// walk validates the array of parts at b[v] == '[' (nesting depth 3) and
// notes each part's text or raw span.
func (pl *partList) walk(b []byte, v int) (int, error) {
	var kbuf [24]byte
	pl.at, pl.ok, pl.n = int32(v), true, 0 // at: v > 0 inside a body
	arr := newArrayIter(b, v)
	obj := newObjectIter(b, v, 5) // reused for each object part (restart)
	for arr.next() {
		p := arr.val
		var text str
		var end int
		switch b[p] {
		case '"':
			e, esc, err := scanString(b, p)
			if err != nil {
				return 0, err
			}
			text, end = str{p + 1, e - 1, esc, true}, e
		case '{':
			obj.restart(p)
			for obj.next() {
				key := decodeKey(obj.key, obj.esc, &kbuf)
				val := obj.val
				if b[val] == '"' {
					e, esc, err := scanString(b, val)
					if err != nil {
						return 0, err
					}
					if string(key) == "text" {
						text = str{val + 1, e - 1, esc, true}
					}
					obj.i = e
					continue
				}
				if string(key) == "text" {
					text = str{}
				}
				obj.skip()
			}
			if obj.err != nil {
				return 0, obj.err
			}
			end = obj.end
		default:
			e, err := skipValue(b, p, 4)
			if err != nil {
				return 0, err
			}
			end = e
		}
		arr.i = end
		if pl.n == len(pl.part) {
			pl.ok = false
			continue
		}
		pl.part[pl.n].text, pl.part[pl.n].isText = text, text.set
		pl.part[pl.n].off, pl.part[pl.n].end = p, end
		pl.n++
	}
	if arr.err != nil {
		return 0, arr.err
	}
	return arr.end, nil
}

// write writes the noted parts as writeParts would.
func (pl *partList) write(k *blocker, b []byte) {
	for i := range pl.part[:pl.n] {
		p := &pl.part[i]
		k.writeByte(sepField)
		if p.isText {
			k.writeString(p.text.raw(b), p.text.esc)
		} else {
			k.writeDigest(b[p.off:p.end])
		}
	}
}

// writeParts writes an array of content parts at b[v] == '[': each part's
// text in order (a string part, or an object's "text" string), and a
// digest of any other part.
func writeParts(k *blocker, b []byte, v int) {
	var kbuf [24]byte
	arr := newLaxArr(b, v)
	for arr.next() {
		p := arr.val
		k.writeByte(sepField)
		switch b[p] {
		case '"':
			end, esc := laxString(b, p)
			arr.i = end
			k.writeString(b[p+1:end-1], esc)
			continue
		case '{':
		default:
			end := laxSkip(b, p)
			arr.i = end
			k.writeDigest(b[p:end])
			continue
		}
		var text str
		obj := newLaxObj(b, p)
		for obj.next() {
			key := decodeKey(obj.key, obj.esc, &kbuf)
			val := obj.val
			if b[val] == '"' {
				end, esc := laxString(b, val)
				if string(key) == "text" {
					text = str{val + 1, end - 1, esc, true}
				}
				obj.i = end
				continue
			}
			if string(key) == "text" {
				text = str{}
			}
			obj.i = laxSkip(b, val)
		}
		arr.i = obj.end
		if text.set {
			k.writeString(text.raw(b), text.esc)
		} else {
			k.writeDigest(b[p:obj.end])
		}
	}
}

// writePrompt writes a completions prompt at b[v]: a string, or an array
// of strings or token ids.
func writePrompt(k *blocker, b []byte, v int) {
	if b[v] == '"' {
		end, esc := laxString(b, v)
		k.writeString(b[v+1:end-1], esc)
		return
	}
	arr := newLaxArr(b, v)
	for arr.next() {
		p := arr.val
		if b[p] == '"' {
			end, esc := laxString(b, p)
			arr.i = end
			k.writeString(b[p+1:end-1], esc)
			k.writeByte(sepMessage)
			continue
		}
		end := laxSkip(b, p)
		arr.i = end
		k.writeCompact(b[p:end])
		k.writeByte(sepField)
	}
}

// AppendTokenBlocks appends to dst the chained keys of every full block of
// blockSize token ids, seeded by seed. The precise index (kvindex) keys
// engine blocks this way, from the token ids carried by KV events.
func AppendTokenBlocks(dst []uint64, seed uint64, tokens []uint32, blockSize int) []uint64 {
	prev := seed
	for len(tokens) >= blockSize && blockSize > 0 {
		prev = HashTokenBlock(prev, tokens[:blockSize])
		dst = append(dst, prev)
		tokens = tokens[blockSize:]
	}
	return dst
}

// HashTokenBlock returns the key of one block of token ids chained to the
// key of its parent block (or to the seed for the first block).
func HashTokenBlock(parent uint64, tokens []uint32) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(parent)
	var buf [256]byte
	for len(tokens) > 0 {
		n := len(tokens)
		if n > len(buf)/4 {
			n = len(buf) / 4
		}
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		d.Write(buf[:4*n])
		tokens = tokens[n:]
	}
	return d.Sum64()
}
