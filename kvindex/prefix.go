package kvindex

import (
	"encoding/binary"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

// The message-prefix cache. A chat request usually repeats an earlier
// request's messages and adds some (the next turn of a conversation, an
// agent's next step, one more question under a shared system prompt). The
// engine's tokens of those first messages are a prefix of the new
// request's tokens whenever its chat template renders messages one after
// another (ChatML, Llama 3, and every template under which the engine's
// own prefix cache can reuse a conversation's blocks), so they are known
// before the /tokenize call: the request is routed on their exact overlap
// at once, and its own preflight runs in the background (a Late handle:
// its tokens predict the chosen replica's blocks and fill the cache).
//
// The cache is the Tokenizer's, keyed by a hash of the model, the tools
// and the raw bytes of the first k messages (prefixKeys). It learns from
// every chat tokenization (the tokens of its messages, with the assistant
// header that opens the reply: the header the next turn's history renders
// the reply under), and, for a request whose messages share no cached
// prefix, from one background tokenization of all its messages but the
// last (NoGenerationPrompt) so that the next request under the same
// system prompt finds it. Whether the template keeps prefixes is checked,
// not assumed: every full tokenization that had a cached prefix is
// compared with it, and the prefix is used for routing only once
// prefixTrustChecks comparisons agreed, and no longer when more than
// prefixTrustBad of the recent ones disagree.
const (
	// maxPrefixScan bounds the message boundaries looked up per request
	// (the last ones: the longest prefixes).
	maxPrefixScan = 64
	// prefixTrustChecks is how many comparisons must agree before cached
	// prefixes route requests.
	prefixTrustChecks = 4
	// prefixTrustWeight is the weight of one comparison in the recent
	// disagreement share; past prefixTrustBad prefixes stop routing.
	prefixTrustWeight = 0.1
	prefixTrustBad    = 0.1
)

// messageEnds appends to dst the offset just past each element of the JSON
// array msgs (its last byte, before any space, comma or the closing
// bracket), and reports whether msgs is an array it could split. It checks
// only the nesting, not the JSON: the parse that found msgs did.
func messageEnds(dst []int32, msgs []byte) ([]int32, bool) {
	i := 0
	for i < len(msgs) && isSpace(msgs[i]) {
		i++
	}
	if i == len(msgs) || msgs[i] != '[' {
		return dst, false
	}
	depth, last := 0, -1
	for i++; i < len(msgs); i++ {
		c := msgs[i]
		switch {
		case isSpace(c):
			continue
		case c == '"':
			end, ok := selection.StringEnd(msgs, i)
			if !ok {
				return dst, false
			}
			i, last = end-1, end
			continue
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth == 0 {
				if c != ']' {
					return dst, false
				}
				if last >= 0 {
					dst = append(dst, int32(last))
				}
				return dst, true
			}
			depth--
		case c == ',' && depth == 0:
			if last < 0 {
				return dst, false
			}
			dst = append(dst, int32(last))
			last = -1
			continue
		}
		last = i + 1
	}
	return dst, false
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// prefixKeys appends the cache key of each message prefix of msgs (ends
// from messageEnds): a hash of the model, the tools and msgs up to that
// end. Requests whose first k messages are the same bytes (and model and
// tools) share the k-th key.
func prefixKeys(dst []uint64, model string, tools, msgs []byte, ends []int32) []uint64 {
	var d xxhash.Digest
	d.Reset()
	var n [8]byte
	d.WriteString("ramjet message prefix\x00")
	binary.LittleEndian.PutUint64(n[:], uint64(len(model)))
	d.Write(n[:])
	d.WriteString(model)
	binary.LittleEndian.PutUint64(n[:], uint64(len(tools)))
	d.Write(n[:])
	d.Write(tools)
	prev := 0
	for _, e := range ends {
		d.Write(msgs[prev:e])
		prev = int(e)
		dst = append(dst, d.Sum64())
	}
	return dst
}

// prefixScratch is the pooled working memory of one lookup.
type prefixScratch struct {
	ends []int32
	keys []uint64
}

var prefixPool = sync.Pool{New: func() any { return new(prefixScratch) }}

// msgPrefix is what the cache knows of one chat request's messages.
type msgPrefix struct {
	n       int      // messages in the request; 0: not a splittable chat
	k       int      // messages of the longest cached prefix; 0: none
	tokens  []uint32 // its tokens (shared: do not modify)
	fullKey uint64   // the key of all n messages
	bareKey uint64   // the key of the first n-1 messages (n >= 2)
	bareEnd int32    // their end in the messages
	end     int32    // the end of the k cached messages in the messages
}

// lookupPrefix finds the longest cached prefix of req's messages.
func (p *Precise) lookupPrefix(req TokenizeRequest) msgPrefix {
	sc := prefixPool.Get().(*prefixScratch)
	defer prefixPool.Put(sc)
	var ok bool
	sc.ends, ok = messageEnds(sc.ends[:0], req.Messages)
	if !ok || len(sc.ends) == 0 {
		return msgPrefix{}
	}
	sc.keys = prefixKeys(sc.keys[:0], req.Model, req.Tools, req.Messages, sc.ends)
	n := len(sc.ends)
	m := msgPrefix{n: n, fullKey: sc.keys[n-1]}
	if n >= 2 {
		m.bareKey, m.bareEnd = sc.keys[n-2], sc.ends[n-2]
	}
	for k := n; k >= 1 && k > n-maxPrefixScan; k-- {
		if toks, ok := p.tk.peek(sc.keys[k-1]); ok {
			m.k, m.tokens, m.end = k, toks, sc.ends[k-1]
			break
		}
	}
	return m
}

// prefixTrust is the record of comparisons between cached prefixes and the
// full tokenizations of the requests that had them.
type prefixTrust struct {
	mu      sync.Mutex
	checks  int
	bad     float64 // recent disagreement share
	trusted atomic.Bool

	routed, agreed, disagreed atomic.Uint64
}

// learned is a chat request's full tokenization: it caches the tokens of
// its messages and checks the prefix the request had, if any.
func (p *Precise) learned(m msgPrefix, tokens []uint32) {
	if m.n == 0 {
		return
	}
	p.tk.keep(m.fullKey, tokens)
	if m.tokens == nil || m.k == m.n {
		return
	}
	// A prefix agrees when it is the tokens' prefix but for its last
	// block: a prefix kept from a whole request ends with the reply's
	// header, which a following user message renders otherwise.
	slack := max(p.x.BlockSize(), 1)
	n := 0
	for n < len(m.tokens) && n < len(tokens) && m.tokens[n] == tokens[n] {
		n++
	}
	p.notePrefix(n >= len(m.tokens)-slack)
}

func (p *Precise) notePrefix(agreed bool) {
	t := &p.pfx
	v := 1.0
	if agreed {
		v = 0
		t.agreed.Add(1)
	} else {
		t.disagreed.Add(1)
	}
	t.mu.Lock()
	t.checks++
	t.bad += prefixTrustWeight * (v - t.bad)
	t.trusted.Store(t.checks >= prefixTrustChecks && t.bad <= prefixTrustBad)
	t.mu.Unlock()
}

// PrefixStats counts the requests routed by a cached message prefix
// without waiting for their preflight, and the comparisons of cached
// prefixes with full tokenizations that agreed and that disagreed.
func (p *Precise) PrefixStats() (routed, agreed, disagreed uint64) {
	t := &p.pfx
	return t.routed.Load(), t.agreed.Load(), t.disagreed.Load()
}

// barePrefix starts, in the background, the tokenization of all of req's
// messages but the last, for the requests that will share them.
func (p *Precise) barePrefix(base string, m msgPrefix, req TokenizeRequest) {
	if m.n < 2 || m.k > 0 {
		return
	}
	msgs := make([]byte, 0, m.bareEnd+1)
	msgs = append(append(msgs, req.Messages[:m.bareEnd]...), ']')
	bare := TokenizeRequest{Model: req.Model, Messages: msgs, Tools: req.Tools, NoGenerationPrompt: true}
	p.tk.Start(base, m.bareKey, bare) // busy: the next request tries again
}
