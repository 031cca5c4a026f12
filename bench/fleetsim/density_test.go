package fleetsim

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// densityConfig is a small router configuration: blocks of 4 tokens (16
// bytes at 4 bytes per token), 64 of them at most.
func densityConfig(t *testing.T) selection.Config {
	t.Helper()
	c := selection.Config{BlockTokens: 4, PrefixTokens: 4 * 64, CharsPerToken: 4}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

func randomTokens(rng *rand.Rand, n int) []uint32 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(rng.IntN(600))
	}
	return toks
}

// sharedBlocks is how many leading keys a and b have in common.
func sharedBlocks(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// At the router's own chars_per_token the blocks are AppendTokenBlocks over
// the bounded prefix: the fleet simulation's figures before -density.
func TestDensityBlocksAtCharsPerToken(t *testing.T) {
	c := densityConfig(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 3, 4, 5, 63, 64, 255, 256, 257, 1000} {
		toks := randomTokens(rng, n)
		limit := c.PrefixTokens / c.BlockTokens * c.BlockTokens
		want := selection.AppendTokenBlocks(nil, 7, toks[:min(n, limit)], c.BlockTokens)
		for _, d := range []float64{0, c.CharsPerToken} {
			got, bytes, trunc := DensityBlocks(nil, 7, toks, d, c)
			if !slices.Equal(got, want) {
				t.Fatalf("n=%d density=%v: %d blocks differ from AppendTokenBlocks' %d", n, d, len(got), len(want))
			}
			if bytes != n*4 || trunc != (n >= limit) {
				t.Fatalf("n=%d density=%v: bytes=%d truncated=%v, want %d %v", n, d, bytes, trunc, n*4, n >= limit)
			}
		}
	}
}

// At any density a block is the same for two prompts exactly when the
// bytes it covers lie within their common prefix: two prompts sharing t
// tokens share floor(t x density / B) blocks (B: the block's bytes), and a
// prompt of n tokens has floor(n x density / B) of them, both at most the
// bound's.
func TestDensityBlocksPrefix(t *testing.T) {
	c := densityConfig(t)
	bb := float64(c.BlockTokens) * c.CharsPerToken
	maxBlocks := c.PrefixTokens / c.BlockTokens
	rng := rand.New(rand.NewPCG(3, 4))
	for _, d := range []float64{0.5, 1, 2.5, 3, 3.3, 4, 4.7, 5, 7.5} {
		for range 300 {
			n := rng.IntN(600)
			share := rng.IntN(n + 1)
			a := randomTokens(rng, n)
			b := slices.Clone(a)
			for i := share; i < n; i++ {
				b[i] = a[i] + 1 + uint32(rng.IntN(5)) // differs from a[i]
			}
			ka, bytes, trunc := DensityBlocks(nil, 9, a, d, c)
			kb, _, _ := DensityBlocks(nil, 9, b, d, c)
			wantN := min(maxBlocks, int(math.Floor(float64(n)*d/bb)))
			if len(ka) != wantN || len(kb) != wantN {
				t.Fatalf("density %v n=%d: %d and %d blocks, want %d", d, n, len(ka), len(kb), wantN)
			}
			if want := min(wantN, int(math.Floor(float64(share)*d/bb))); sharedBlocks(ka, kb) != want {
				t.Fatalf("density %v n=%d sharing %d tokens: %d blocks shared, want %d", d, n, share, sharedBlocks(ka, kb), want)
			}
			if bytes != int(float64(n)*d) || trunc != (bytes >= maxBlocks*int(bb)) {
				t.Fatalf("density %v n=%d: bytes=%d truncated=%v", d, n, bytes, trunc)
			}
		}
	}
}

// The mapping gives the router the structure its own Extractor derives from
// a body whose text has density bytes per token: every token rendered as
// density bytes, two prompts' blocks have the same count and the same
// common prefix as the production fingerprint's, and the same truncation.
func TestDensityBlocksMatchesExtractor(t *testing.T) {
	c := densityConfig(t)
	x := selection.NewExtractor(c)
	render := func(toks []uint32, d int) string {
		var sb strings.Builder
		for _, id := range toks {
			// d base-26 letters of id (ids < 600 < 26^2), lowest first: b's
			// differing tokens (id + 1) differ from their first byte on.
			for k := range d {
				sb.WriteByte(byte('a' + (id/pow26(k))%26))
			}
		}
		return sb.String()
	}
	parse := func(text string) *selection.Features {
		f := x.NewFeatures()
		if err := x.Parse(selection.EndpointCompletions, []byte(`{"model":"m","prompt":"`+text+`"}`), f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, d := range []int{2, 3, 4, 5, 7} {
		for range 100 {
			n := rng.IntN(400)
			share := rng.IntN(n + 1)
			a := randomTokens(rng, n)
			b := slices.Clone(a)
			for i := share; i < n; i++ {
				b[i] = (a[i] + 1) % 600
			}
			pa, pb := parse(render(a, d)), parse(render(b, d))
			ka, bytes, trunc := DensityBlocks(nil, 0, a, float64(d), c)
			kb, _, _ := DensityBlocks(nil, 0, b, float64(d), c)
			if len(ka) != len(pa.Blocks) || bytes != pa.PromptBytes || trunc != pa.Truncated {
				t.Fatalf("density %d n=%d: blocks=%d bytes=%d truncated=%v, Extractor %d %d %v", d, n, len(ka), bytes, trunc, len(pa.Blocks), pa.PromptBytes, pa.Truncated)
			}
			if got, want := sharedBlocks(ka, kb), sharedBlocks(pa.Blocks, pb.Blocks); got != want {
				t.Fatalf("density %d n=%d sharing %d tokens: %d blocks shared, Extractor %d", d, n, share, got, want)
			}
		}
	}
}

func pow26(k int) uint32 {
	p := uint32(1)
	for range k {
		p *= 26
	}
	return p
}

// Every ramjet policy made while RamjetDensity is set (ramjet, the precise
// path, each instance of several) sees the prompts at that density.
func TestDensityReachesPolicies(t *testing.T) {
	RamjetDensity = 3
	defer func() { RamjetDensity = 0 }()
	var pols []*Ramjet
	for _, name := range []string{"ramjet", "ramjet-precise", "ramjet@cw=0.5"} {
		p, err := NewPolicy(name, 1, selection.Config{})
		if err != nil {
			t.Fatal(err)
		}
		switch p := p.(type) {
		case *Ramjet:
			pols = append(pols, p)
		case *RamjetPrecise:
			pols = append(pols, p.Ramjet)
		default:
			t.Fatalf("%s: %T", name, p)
		}
	}
	m, err := NewMulti("ramjet", 2, FrontRoundRobin, 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.(*Multi).Instances() {
		pols = append(pols, p.(*Ramjet))
	}
	toks := randomTokens(rand.New(rand.NewPCG(7, 8)), 1000)
	r := &Request{Prompt: toks}
	for _, p := range pols {
		p.features(r)
		want, bytes, _ := DensityBlocks(nil, p.seed, toks, 3, p.rt.Config())
		if p.f.PromptBytes != 3000 || bytes != 3000 || !slices.Equal(p.f.Blocks, want) {
			t.Fatalf("%s: PromptBytes %d and %d blocks, want 3000 and %d", p.Name(), p.f.PromptBytes, len(p.f.Blocks), len(want))
		}
	}
}

// fixedAnnotator gives candidate 0 an exact overlap of x tokens.
type fixedAnnotator struct{ x, decided int }

func (a *fixedAnnotator) Annotate(_ *selection.Features, cands []selection.Candidate, _ *selection.Scratch) bool {
	for i := range cands {
		cands[i].Precise = i == 0
	}
	cands[0].Overlap = a.x
	return true
}

func (a *fixedAnnotator) Decided(*selection.Features, []selection.Candidate, selection.Decision, *selection.Scratch) {
	a.decided++
}

// The dpx probe hands Pick the exact overlap in the estimate's tokens: a
// prompt of 10,000 real tokens at 2.5 bytes per token is 6,250 estimated
// tokens, so an exact 8,000 is 5,000 of them (on the 64-token grid: 4,992).
func TestEstUnits(t *testing.T) {
	cfg := selection.Config{}
	cfg.SetDefaults()
	inner := &fixedAnnotator{x: 8000}
	a := estUnits{a: inner, cfg: cfg}
	f := &selection.Features{PromptBytes: 25000}
	s := &selection.Scratch{Tokens: make([]uint32, 10000)}
	cands := make([]selection.Candidate, 2)
	if !a.Annotate(f, cands, s) || !cands[0].Precise || cands[1].Precise {
		t.Fatal("annotation lost")
	}
	if want := 5000 - 5000%cfg.BlockTokens; cands[0].Overlap != want {
		t.Fatalf("overlap %d, want %d", cands[0].Overlap, want)
	}
	a.Decided(f, cands, selection.Decision{}, s)
	if inner.decided != 1 {
		t.Fatal("Decided not passed on")
	}
	f.PromptBytes = 40000 // at chars_per_token: unchanged
	if a.Annotate(f, cands, s); cands[0].Overlap != 8000 {
		t.Fatalf("at chars_per_token: overlap %d, want 8000", cands[0].Overlap)
	}
}

// unitsRun replays w over 8 replicas of 65,536 tokens with policy name,
// the ramjet policies seeing every prompt at density bytes per token.
func unitsRun(t *testing.T, w *workload.Workload, name string, density float64) *Result {
	t.Helper()
	RamjetDensity = density
	defer func() { RamjetDensity = 0 }()
	p, err := NewPolicy(name, 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Config{Workload: w, Replicas: 8, Engine: engine.Config{CapacityTokens: 65536}, Policy: p, Salt: 1})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// At 2.5 bytes per token, the rule with every figure in the same real
// tokens as at chars_per_token (the capacity told in the index's
// estimated tokens, capx = 2.5/4, dl=0; request_cost, affinity_cap,
// prefix_tokens, the pair floor, output_weight and tie_epsilon x 2.5/4;
// blocks of 40 estimated tokens, 160 bytes, which cover the same 64 real
// tokens) decides every request as ramjet does at 4 bytes per token: the
// yardstick of bench/RESULTS.md "Dense content at the true capacity".
// Without the block grain (bt, pt) the runs differ.
func TestDensityUnitsConsistent(t *testing.T) {
	w := generate(t, "agent-fleet", workload.Options{Seed: 1, Scale: 0.25})
	const units = "ramjet@dl=0+capx=0.625+rc=320+cap=40960+pairfloor=122880+outw=2.5+eps=0.625"
	want := unitsRun(t, w, "ramjet", 4)
	same := func(r *Result) bool {
		for i := range r.Records {
			a, b := r.Records[i], want.Records[i]
			if a.Replica != b.Replica || a.Cached != b.Cached || a.First != b.First {
				return false
			}
		}
		return true
	}
	if got := unitsRun(t, w, units+"+bt=40+pt=81920", 2.5); !same(got) {
		t.Errorf("%s+bt=40+pt=81920 at 2.5 bytes per token decides otherwise than ramjet at 4", units)
	}
	if got := unitsRun(t, w, "ramjet@cpt=2.5", 2.5); !same(got) {
		t.Errorf("ramjet@cpt=2.5 at 2.5 bytes per token decides otherwise than ramjet at 4")
	}
	if got := unitsRun(t, w, units, 2.5); same(got) {
		t.Errorf("%s (the block grain of 256 bytes) at 2.5 decides as ramjet at 4: the test cannot see the grain", units)
	}
}

// ramjet@capi=K tells the index K x the capacity the load terms get
// (IndexShare off); cpt, bt and pt set chars_per_token, block_tokens and
// prefix_tokens.
func TestRamjetNamedUnitsProbes(t *testing.T) {
	p, err := NewPolicy("ramjet@capi=1.5+cpt=2.5+bt=40+pt=81920", 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r := p.(*Ramjet)
	if c := r.rt.Config(); c.CharsPerToken != 2.5 || c.BlockTokens != 40 || c.PrefixTokens != 81920 {
		t.Errorf("config %+v, want chars_per_token 2.5, block_tokens 40, prefix_tokens 81920", c)
	}
	if r.rt.Options().IndexShare != -1 {
		t.Errorf("IndexShare %v with capi, want -1 (off)", r.rt.Options().IndexShare)
	}
	fleet := []*Replica{{KVCapacity: 64000}}
	if err := r.ensure(fleet); err != nil {
		t.Fatal(err)
	}
	if got, want := r.rt.Capacity(r.cands[0].Slot), int64(96000); got != want {
		t.Errorf("index capacity %d tokens, want %d (1.5 x 64000)", got, want)
	}
}
