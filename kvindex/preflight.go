package kvindex

import (
	"context"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ramjet-llm/ramjet/selection"
)

// Preflight returns the token ids of a parsed chat or completions body for
// the precise path, before selection: the cached tokenization of an
// identical body, else one /tokenize call built from the body's one parse
// (RequestFor) and bounded by timeout. The cache is keyed by the whole
// body: identical bodies (retries, repeated prompts) skip both the request
// build and the call; bodies that differ only outside the prompt merely
// miss. A call past timeout keeps running in the background (Preflight):
// probe reports the replica the request was routed to, so that its late
// tokens still predict that replica's blocks.
func (p *Precise) PreflightBody(ctx context.Context, ep selection.Endpoint, body []byte, f *selection.Features, timeout time.Duration, probe func() (selection.Slot, bool)) ([]uint32, *Late, error) {
	key := xxhash.Sum64(body)
	if toks, ok := p.Tokenizer().Cached(key); ok {
		return toks, nil, nil
	}
	req, err := RequestFor(ep, body, f)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return p.Preflight(ctx, key, req, probe)
}
