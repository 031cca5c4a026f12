package workload

// SynthCache is a Synth that keeps the streams it generated, up to a
// budget of tokens, so that a session's N-th turn copies the context its
// earlier turns generated instead of recomputing it (an agent's turns
// re-send a context that grows past 100k tokens), and a group's prefix is
// computed once. Its Prompt and Completion are exactly Synth's. Not safe
// for concurrent use: one per simulation run.
type SynthCache struct {
	Synth  Synth
	budget int
	used   int
	kept   map[streamKey][]uint32
}

type streamKey struct{ kind, id uint64 }

// NewSynthCache returns a cache over s that keeps at most budget tokens
// (4 bytes each); streams past the budget are computed on every call.
func NewSynthCache(s Synth, budget int) *SynthCache {
	return &SynthCache{Synth: s, budget: budget, kept: make(map[streamKey][]uint32)}
}

// Prompt is Synth.Prompt.
func (c *SynthCache) Prompt(dst []uint32, r Request) []uint32 { return prompt(c, dst, r) }

// Completion is Synth.Completion.
func (c *SynthCache) Completion(dst []uint32, r Request) []uint32 { return completion(c, dst, r) }

func (c *SynthCache) stream64(dst []uint32, kind, id uint64, off, n int) []uint32 {
	if n <= 0 {
		return dst
	}
	k := streamKey{kind, id}
	st := c.kept[k]
	if more := off + n - len(st); more > 0 {
		if c.used+more > c.budget {
			return c.Synth.stream64(dst, kind, id, off, n)
		}
		st = c.Synth.stream64(st, kind, id, len(st), more)
		c.used += more
		c.kept[k] = st
	}
	return append(dst, st[off:off+n]...)
}
