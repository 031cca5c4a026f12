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
// miss.
func (p *Precise) Preflight(ctx context.Context, ep selection.Endpoint, body []byte, f *selection.Features, timeout time.Duration) ([]uint32, error) {
	key := xxhash.Sum64(body)
	if toks, ok := p.Tokenizer().Cached(key); ok {
		return toks, nil
	}
	req, err := RequestFor(ep, body, f)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return p.Tokenize(ctx, key, req)
}
