package kvindex

import (
	"context"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

// prefixMaxTail is how many trailing messages a cached message prefix may
// lack for the request to be routed on it at once: a conversation's
// previous request (its reply and the next user message, or an agent's
// tool call and result). A prefix further back is another instance's
// turns missing (several ramjet instances behind a round-robin front each
// see 1/N of a conversation), or a shared system prompt under an agent's
// own history: routing on it would tie every replica that holds the
// shared part and lose the conversation's home, so the request waits for
// its preflight instead.
const prefixMaxTail = 2

// Preflight returns the token ids of a parsed chat or completions body for
// the precise path, before selection: the cached tokenization of an
// identical body, else one /tokenize call built from the body's one parse
// (RequestFor) and bounded by timeout. The cache is keyed by the whole
// body: identical bodies (retries, repeated prompts) skip both the request
// build and the call; bodies that differ only outside the prompt merely
// miss. A call past timeout keeps running in the background (Preflight):
// probe reports the replica the request was routed to, so that its late
// tokens still predict that replica's blocks.
//
// A chat whose first messages were tokenized before (the message-prefix
// cache, prefix.go) does not wait once cached prefixes proved to be the
// engine's: it returns the prefix's tokens at once, to route on, with the
// Late handle of its own preflight, which is sent once the request's
// response begins (Late.FirstByte) or it ends (deferLate). Any other
// request waits only where the exact overlaps may decide otherwise than
// the estimate (the wait rule, diverge.go: an engine dropped indexed blocks
// within RemovalWindow, other instances seen, or tokenize_wait always);
// else it returns at once with the Late handle of its preflight, sent now,
// and no tokens.
func (p *Precise) PreflightBody(ctx context.Context, ep selection.Endpoint, body []byte, f *selection.Features, timeout time.Duration, probe func() (selection.Slot, bool)) ([]uint32, *Late, error) {
	key := xxhash.Sum64(body)
	if toks, ok := p.Tokenizer().Cached(key); ok {
		return toks, nil, nil
	}
	req, err := RequestFor(ep, body, f)
	if err != nil {
		return nil, nil, err
	}
	var m msgPrefix
	if ep == selection.EndpointChat {
		m = p.lookupPrefix(req)
		if m.k > 0 && m.k == m.n {
			return m.tokens, nil, nil // the same messages, model and tools
		}
		if m.k > 0 && m.n-m.k <= prefixMaxTail && p.pfx.trusted.Load() {
			if _, err := p.tokenizeBase(true); err != nil {
				return nil, nil, err
			}
			p.pfx.routed.Add(1)
			l := p.deferLate(key, req, probe, m)
			if !p.WaitPreflight() {
				// The exact overlaps would decide as the estimate (the
				// wait rule): routed by it, without their lookup.
				p.div.unwaited.Add(1)
				l.prefix = len(m.tokens)
				return nil, l, nil
			}
			return m.tokens, l, nil
		}
	}
	var toks []uint32
	var l *Late
	if !p.WaitFor(f) {
		toks, l, err = p.preflight(ctx, key, req, probe, m, false)
	} else {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		toks, l, err = p.preflight(ctx, key, req, probe, m, true)
	}
	l.estimated(p, f)
	return toks, l, err
}
