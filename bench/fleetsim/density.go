package fleetsim

import (
	"math"

	"github.com/ramjet-llm/ramjet/selection"
)

// RamjetDensity, when positive and not the router's chars_per_token, is the
// content density of every prompt the ramjet policies see: bytes of prompt
// text per real token (fleetsim's -density). Real content is not
// chars_per_token bytes per token: code, JSON and tool output run at about
// 2.5-3.5, prose at 4.2-5. The engines count real tokens whatever it is;
// only what the router derives from bytes (its blocks, PromptBytes, the
// prefix bound) moves. 0: the router's chars_per_token (every prompt at
// exactly the density the router assumes, as before the flag).
var RamjetDensity float64

// DensityBlocks appends to dst the router's block keys of a prompt of real
// token ids toks whose text has density bytes per token, as the router's
// Extractor fingerprints such a body, and returns them with the prompt's
// size in bytes and whether the prefix bound cut it. cfg is the router's
// configuration with its defaults applied (Router.Config).
//
// Block k covers the prompt's bytes [k*B, (k+1)*B), B = BlockTokens x
// CharsPerToken (the Extractor's block size), that is the tokens
// [floor(k*B/density), ceil((k+1)*B/density)): its key chains the hash of
// those token ids (selection.HashTokenBlock) to the previous block's, so
// equal token prefixes give equal keys and a block straddling the first
// differing token differs. Only full blocks count, at most PrefixTokens /
// BlockTokens of them (the bound in the router's estimated tokens, bytes /
// CharsPerToken, as Extract applies it); truncated reports a prompt that
// reached that bound (the Extractor flags one exactly at it too). At
// density = CharsPerToken (or density <= 0) the keys are
// selection.AppendTokenBlocks over the bounded prefix with BlockTokens.
func DensityBlocks(dst []uint64, seed uint64, toks []uint32, density float64, cfg selection.Config) (blocks []uint64, promptBytes int, truncated bool) {
	if density <= 0 {
		density = cfg.CharsPerToken
	}
	bb := max(1, int(float64(cfg.BlockTokens)*cfg.CharsPerToken))
	maxBlocks := cfg.PrefixTokens / cfg.BlockTokens
	promptBytes = int(float64(len(toks)) * density)
	n := min(promptBytes/bb, maxBlocks)
	truncated = promptBytes >= maxBlocks*bb // as the Extractor's blocker flags it
	prev := seed
	for k := range n {
		lo := int(math.Floor(float64(k*bb) / density))
		hi := min(len(toks), int(math.Ceil(float64((k+1)*bb)/density)))
		prev = selection.HashTokenBlock(prev, toks[lo:hi])
		dst = append(dst, prev)
	}
	return dst, promptBytes, truncated
}

// estUnits is the precise path's annotator with every exact overlap it
// gives converted from the request's real tokens into the router's
// estimated tokens (x the estimate's prompt tokens / the real ones, then
// down to whole router blocks), the units of the estimate beside it and of
// the prompt Pick subtracts it from: the "dpx" probe of ramjet-precise.
// The annotator's own comparisons (the estimate cap, the queue rule) are
// untouched.
type estUnits struct {
	a   selection.Annotator
	cfg selection.Config
}

func (e estUnits) Annotate(f *selection.Features, cands []selection.Candidate, s *selection.Scratch) bool {
	ok := e.a.Annotate(f, cands, s)
	n, est := len(s.Tokens), f.PromptTokens(e.cfg)
	if !ok || n == 0 || est == n {
		return ok
	}
	for i := range cands {
		if c := &cands[i]; c.Precise {
			c.Overlap = int(int64(c.Overlap) * int64(est) / int64(n))
			c.Overlap -= c.Overlap % e.cfg.BlockTokens
		}
	}
	return ok
}

func (e estUnits) Decided(f *selection.Features, cands []selection.Candidate, d selection.Decision, s *selection.Scratch) {
	e.a.Decided(f, cands, d, s)
}

// annotator is Route's annotator: the precise path's, converted to the
// estimate's units with the dpx probe.
func (p *Ramjet) annotator() selection.Annotator {
	if p.dpx {
		return estUnits{a: p.pre, cfg: p.rt.Config()}
	}
	return p.pre
}
