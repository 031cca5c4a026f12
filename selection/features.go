package selection

import (
	"encoding/binary"
	"strings"

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

// Features is what routing needs from one request. Byte slices alias the
// body passed to Extract and are valid only as long as it is.
type Features struct {
	Endpoint Endpoint
	// Model is the raw "model" string (escapes not decoded).
	Model []byte
	// CacheSalt is the raw "cache_salt" string, if any.
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
}

// Reset clears f for reuse, keeping the capacity of Blocks.
func (f *Features) Reset() {
	*f = Features{Blocks: f.Blocks[:0]}
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

// Extractor parses request bodies into Features for one Config. It is a
// small value, safe for concurrent use.
type Extractor struct {
	blockBytes int
	maxBlocks  int
}

// NewExtractor returns an Extractor for c (defaults must be set).
func NewExtractor(c Config) Extractor {
	return Extractor{blockBytes: c.blockBytes(), maxBlocks: c.maxBlocks()}
}

// MaxBlocks is the capacity Features.Blocks needs for Extract not to
// allocate.
func (x Extractor) MaxBlocks() int { return x.maxBlocks }

// NewFeatures returns Features whose Blocks can hold a full prefix.
func (x Extractor) NewFeatures() *Features {
	return &Features{Blocks: make([]uint64, 0, x.maxBlocks)}
}

// blocker cuts the canonical prompt stream into fixed-size blocks and chains
// their hashes. It lives on the caller's stack.
type blocker struct {
	d      xxhash.Digest
	fill   int
	bb     int
	max    int
	blocks []uint64
	total  int
	full   bool
}

func (k *blocker) write(p []byte) {
	k.total += len(p)
	for len(p) > 0 && !k.full {
		n := k.bb - k.fill
		if n > len(p) {
			n = len(p)
		}
		k.d.Write(p[:n])
		k.fill += n
		p = p[n:]
		if k.fill == k.bb {
			h := k.d.Sum64()
			k.blocks = append(k.blocks, h)
			k.d.ResetWithSeed(h)
			k.fill = 0
			if len(k.blocks) >= k.max {
				k.full = true
			}
		}
	}
}

func (k *blocker) writeByte(c byte) {
	var b [1]byte
	b[0] = c
	k.write(b[:])
}

// writeString writes a JSON string value (raw, without quotes), decoding
// escapes so that two encodings of the same text fingerprint alike.
func (k *blocker) writeString(raw []byte, escaped bool, off int) error {
	if k.full || !escaped {
		k.write(raw)
		return nil
	}
	return unescapeTo(raw, off, k)
}

// writeCompact writes a JSON value with insignificant whitespace removed
// (strings kept as they are).
func (k *blocker) writeCompact(b []byte) error {
	if k.full {
		k.total += len(b)
		return nil
	}
	i := 0
	for i < len(b) {
		j := i
		for j < len(b) && b[j] != '"' && !isWS(b[j]) {
			j++
		}
		if j > i {
			k.write(b[i:j])
		}
		if j >= len(b) {
			break
		}
		if b[j] == '"' {
			end, _, err := scanString(b, j)
			if err != nil {
				return err
			}
			k.write(b[j:end])
			i = end
			continue
		}
		i = j + 1
	}
	return nil
}

// writeDigest writes an 8-byte digest of a compacted JSON value, for parts
// that are not text (images, audio, files).
func (k *blocker) writeDigest(b []byte) {
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

// top-level spans found in the first pass.
type spans struct {
	model, salt             [2]int
	messages, tools, prompt [2]int
	input, instructions     [2]int
}

// Extract parses body (sent to ep) into f. It reads the body once for the
// top-level fields, then walks the prompt fields in canonical order:
// tools, then messages (role, name, content, tool calls). It allocates
// nothing when f.Blocks has capacity MaxBlocks. On malformed JSON or a
// field of the wrong type it returns a *RequestError.
func (x Extractor) Extract(ep Endpoint, body []byte, f *Features) error {
	f.Reset()
	f.Endpoint = ep
	b := body
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return syntaxErr(i, "request body must be a JSON object")
	}
	var sp spans
	maxTok, maxCompl, maxOut := -1, -1, -1
	it := newObjectIter(b, i, 1)
	for it.next() {
		v := it.val
		switch string(it.key) {
		case "model":
			if b[v] != '"' {
				return typeErr("model", v, "a string")
			}
			end, _, err := scanString(b, v)
			if err != nil {
				return err
			}
			sp.model = [2]int{v + 1, end - 1}
			it.i = end
		case "cache_salt":
			if b[v] != '"' {
				return typeErr("cache_salt", v, "a string")
			}
			end, _, err := scanString(b, v)
			if err != nil {
				return err
			}
			sp.salt = [2]int{v + 1, end - 1}
			it.i = end
		case "stream":
			switch {
			case b[v] == 't':
				f.Stream = true
			case b[v] == 'f' || b[v] == 'n':
			default:
				return typeErr("stream", v, "a boolean")
			}
			it.skip()
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			dst, param := &maxOut, "max_output_tokens"
			switch it.key[4] {
			case 't':
				dst, param = &maxTok, "max_tokens"
			case 'c':
				dst, param = &maxCompl, "max_completion_tokens"
			}
			n, end, err := scanUint(b, v, param)
			if err != nil {
				return err
			}
			*dst = n
			it.i = end
		case "messages":
			end, err := spanOf(b, v, '[', "messages", "an array")
			if err != nil {
				return err
			}
			sp.messages = [2]int{v, end}
			it.i = end
		case "tools":
			end, err := skipValue(b, v, 1)
			if err != nil {
				return err
			}
			if b[v] != 'n' {
				sp.tools = [2]int{v, end}
			}
			it.i = end
		case "prompt":
			end, err := skipValue(b, v, 1)
			if err != nil {
				return err
			}
			sp.prompt = [2]int{v, end}
			it.i = end
		case "input":
			end, err := skipValue(b, v, 1)
			if err != nil {
				return err
			}
			sp.input = [2]int{v, end}
			it.i = end
		case "instructions":
			end, err := skipValue(b, v, 1)
			if err != nil {
				return err
			}
			if b[v] == '"' {
				sp.instructions = [2]int{v, end}
			}
			it.i = end
		default:
			it.skip()
		}
	}
	if it.err != nil {
		return it.err
	}
	if j := skipWS(b, it.end); j != len(b) {
		return syntaxErr(j, "unexpected data after the JSON object")
	}
	switch {
	case maxCompl >= 0:
		f.MaxTokens = maxCompl
	case maxTok >= 0:
		f.MaxTokens = maxTok
	case maxOut >= 0:
		f.MaxTokens = maxOut
	}
	f.Model = b[sp.model[0]:sp.model[1]]
	f.CacheSalt = b[sp.salt[0]:sp.salt[1]]

	// The seed: model, then cache_salt. A LoRA adapter is addressed by its
	// model name in vLLM and SGLang, so the model covers it.
	var k blocker
	k.d.ResetWithSeed(0)
	k.d.Write(f.Model)
	k.d.Write([]byte{0})
	k.d.Write(f.CacheSalt)
	f.Seed = k.d.Sum64()
	k.d.ResetWithSeed(f.Seed)
	k.bb, k.max, k.blocks = x.blockBytes, x.maxBlocks, f.Blocks[:0]

	var err error
	switch ep {
	case EndpointChat:
		if sp.tools[1] > 0 {
			k.writeByte(sepSection)
			err = k.writeCompact(b[sp.tools[0]:sp.tools[1]])
		}
		if err == nil && sp.messages[1] > 0 {
			k.writeByte(sepSection)
			err = writeMessages(&k, b, sp.messages[0], sp.messages[1])
		}
	case EndpointCompletions:
		if sp.prompt[1] > 0 {
			err = writePrompt(&k, b, sp.prompt[0], sp.prompt[1])
		}
	case EndpointResponses:
		if sp.tools[1] > 0 {
			k.writeByte(sepSection)
			err = k.writeCompact(b[sp.tools[0]:sp.tools[1]])
		}
		if err == nil && sp.instructions[1] > 0 {
			k.writeByte(sepSection)
			err = writeTextMessage(&k, "system", b, sp.instructions[0])
		}
		if err == nil && sp.input[1] > 0 {
			if b[sp.input[0]] == '"' {
				err = writeTextMessage(&k, "user", b, sp.input[0])
			} else if b[sp.input[0]] == '[' {
				err = writeMessages(&k, b, sp.input[0], sp.input[1])
			} else {
				err = typeErr("input", sp.input[0], "a string or an array")
			}
		}
	}
	f.Blocks = k.blocks
	f.PromptBytes = k.total
	f.Truncated = k.full
	return err
}

// spanOf checks that the value at v opens with open and returns its end.
func spanOf(b []byte, v int, open byte, param, want string) (int, error) {
	if b[v] != open {
		if b[v] == 'n' {
			return skipValue(b, v, 1)
		}
		return 0, typeErr(param, v, want)
	}
	return skipValue(b, v, 1)
}

// scanUint parses a non-negative integer (null counts as absent: -1).
func scanUint(b []byte, v int, param string) (int, int, error) {
	if b[v] == 'n' {
		end, err := literal(b, v, "null")
		return -1, end, err
	}
	end, err := scanNumber(b, v)
	if err != nil {
		return 0, 0, err
	}
	n := 0
	for _, c := range b[v:end] {
		if c < '0' || c > '9' {
			return 0, 0, typeErr(param, v, "a non-negative integer")
		}
		if n < 1<<30 {
			n = n*10 + int(c-'0')
		}
	}
	return n, end, nil
}

func writeTextMessage(k *blocker, role string, b []byte, v int) error {
	end, esc, err := scanString(b, v)
	if err != nil {
		return err
	}
	k.writeByte(sepMessage)
	k.write([]byte(role))
	k.writeByte(sepField)
	return k.writeString(b[v+1:end-1], esc, v)
}

// writeMessages walks a messages (or responses input) array at b[v] == '['.
// Each message is written as: sepMessage role sepField name sepField
// content sepField tool_calls sepField tool_call_id, whatever the key order
// in the body, so that a conversation's turn N+1 starts with turn N. The
// body was validated by the first pass. Once the prefix bound is reached
// the rest is only counted.
func writeMessages(k *blocker, b []byte, v, vend int) error {
	arr := newArrayIter(b, v, 2)
	for arr.next() {
		m := arr.val
		if b[m] != '{' {
			return typeErr("messages", m, "an array of objects")
		}
		if k.full {
			k.total += vend - m
			return nil
		}
		var role, name, content, calls, callID [2]int
		contentEsc := false
		obj := newObjectIter(b, m, 3)
		for obj.next() {
			val := obj.val
			var end int
			esc := false
			if b[val] == '"' {
				end, esc = scanStringLax(b, val)
			} else {
				var err error
				if end, err = skipValue(b, val, 3); err != nil {
					return err
				}
			}
			switch string(obj.key) {
			case "role":
				if b[val] == '"' {
					role = [2]int{val, end}
				}
			case "name":
				if b[val] == '"' {
					name = [2]int{val, end}
				}
			case "content":
				content, contentEsc = [2]int{val, end}, esc
			case "tool_calls":
				calls = [2]int{val, end}
			case "tool_call_id", "call_id":
				callID = [2]int{val, end}
			}
			obj.i = end
		}
		if obj.err != nil {
			return obj.err
		}
		arr.i = obj.end
		k.writeByte(sepMessage)
		if role[1] > 0 {
			k.write(b[role[0]+1 : role[1]-1])
		}
		k.writeByte(sepField)
		if name[1] > 0 {
			k.write(b[name[0]+1 : name[1]-1])
		}
		k.writeByte(sepField)
		if content[1] > 0 {
			if err := writeContent(k, b, content[0], content[1], contentEsc); err != nil {
				return err
			}
		}
		k.writeByte(sepField)
		switch {
		case calls[1] > 0:
			if err := k.writeCompact(b[calls[0]:calls[1]]); err != nil {
				return err
			}
		case role[1] == 0 && content[1] == 0:
			// An item with no role and no content (a responses
			// function_call or function_call_output): the whole item.
			if err := k.writeCompact(b[m:obj.end]); err != nil {
				return err
			}
		}
		k.writeByte(sepField)
		if callID[1] > 0 {
			if err := k.writeCompact(b[callID[0]:callID[1]]); err != nil {
				return err
			}
		}
	}
	return arr.err
}

// writeContent writes a message's content (the value b[v:end]): a string,
// or an array of parts whose text is written in order and whose other parts
// are digested.
func writeContent(k *blocker, b []byte, v, end int, esc bool) error {
	switch b[v] {
	case '"':
		return k.writeString(b[v+1:end-1], esc, v)
	case '[':
		arr := newArrayIter(b, v, 4)
		for arr.next() {
			p := arr.val
			k.writeByte(sepField)
			if b[p] == '"' {
				pend, esc := scanStringLax(b, p)
				arr.i = pend
				if err := k.writeString(b[p+1:pend-1], esc, p); err != nil {
					return err
				}
				continue
			}
			if b[p] != '{' {
				pend, err := skipValue(b, p, 4)
				if err != nil {
					return err
				}
				arr.i = pend
				continue
			}
			text := [2]int{}
			textEsc := false
			obj := newObjectIter(b, p, 5)
			for obj.next() {
				var vend int
				if b[obj.val] == '"' {
					var esc bool
					vend, esc = scanStringLax(b, obj.val)
					if string(obj.key) == "text" {
						text, textEsc = [2]int{obj.val, vend}, esc
					}
				} else {
					var err error
					if vend, err = skipValue(b, obj.val, 5); err != nil {
						return err
					}
				}
				obj.i = vend
			}
			if obj.err != nil {
				return obj.err
			}
			pend := obj.end
			arr.i = pend
			switch {
			case text[1] > 0:
				if err := k.writeString(b[text[0]+1:text[1]-1], textEsc, text[0]); err != nil {
					return err
				}
			case !k.full:
				k.writeDigest(b[p:pend])
			default:
				k.total += pend - p
			}
		}
		return arr.err
	case 'n':
		return nil
	}
	return typeErr("messages", v, "content as a string, an array of parts or null")
}

// writePrompt writes a completions prompt: a string, an array of strings,
// or token ids (compacted).
func writePrompt(k *blocker, b []byte, v, end int) error {
	switch b[v] {
	case '"':
		_, esc, err := scanString(b, v)
		if err != nil {
			return err
		}
		return k.writeString(b[v+1:end-1], esc, v)
	case '[':
		arr := newArrayIter(b, v, 2)
		for arr.next() {
			p := arr.val
			pend, err := skipValue(b, p, 2)
			if err != nil {
				return err
			}
			arr.i = pend
			if b[p] == '"' {
				_, esc, _ := scanString(b, p)
				if err := k.writeString(b[p+1:pend-1], esc, p); err != nil {
					return err
				}
				k.writeByte(sepMessage)
				continue
			}
			if err := k.writeCompact(b[p:pend]); err != nil {
				return err
			}
			k.writeByte(sepField)
		}
		return arr.err
	case 'n':
		return nil
	}
	return typeErr("prompt", v, "a string or an array")
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
