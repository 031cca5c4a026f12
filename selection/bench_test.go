package selection

import (
	"fmt"
	"testing"
)

// BenchmarkExtract measures parse + fingerprint by body size, default knobs.
func BenchmarkExtract(b *testing.B) {
	c := Config{}
	c.SetDefaults()
	x := NewExtractor(c)
	f := x.NewFeatures()
	for _, kib := range []int{1, 16, 64, 256, 512} {
		body := []byte(chatBodyOfSize(kib << 10))
		b.Run(fmt.Sprintf("body=%dKiB", kib), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := x.Extract(EndpointChat, body, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPick measures index lookup + scoring, by prompt length, replica
// count and warmth: "shared" is the common case (every replica holds the
// shared system prompt, a quarter of the prompt, and one holds the whole
// conversation); "staggered" is the worst case for the bisection (every
// replica holds the prompt to a different depth).
func BenchmarkPick(b *testing.B) {
	for _, warm := range []string{"shared", "staggered"} {
		for _, blocks := range []int{16, 1024} {
			for _, n := range []int{2, 8, 64} {
				b.Run(fmt.Sprintf("warm=%s/blocks=%d/replicas=%d", warm, blocks, n), func(b *testing.B) {
					rt, cands := newTestRouter(b, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, n)
					prompt := blocksOf(1, blocks)
					for i, cd := range cands {
						depth := (i * blocks) / n
						if warm == "shared" {
							depth = blocks / 4
							if i == n/2 {
								depth = blocks
							}
						}
						rt.Index().Learn(prompt[:depth], cd.Slot)
					}
					f := features(rt.Config(), prompt, 300)
					s := NewScratch(n)
					b.ReportAllocs()
					for b.Loop() {
						_ = rt.Pick(f, cands, s)
					}
				})
			}
		}
	}
}

// BenchmarkLearn measures recording a routed prompt of 512 blocks.
func BenchmarkLearn(b *testing.B) {
	rt, cands := newTestRouter(b, Config{}, 8)
	prompt := blocksOf(1, 512)
	f := &Features{Blocks: prompt}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rt.Learn(f, cands[i%8].Slot)
		i++
	}
}

// BenchmarkRoute is one full routing call (Pick, Reserve into caller
// storage, Learn), released at once, over 8 replicas sharing a prompt.
func BenchmarkRoute(b *testing.B) {
	for _, blocks := range []int{16, 1024} {
		b.Run(fmt.Sprintf("blocks=%d/replicas=8", blocks), func(b *testing.B) {
			rt, cands := newTestRouter(b, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 8)
			prompt := blocksOf(1, blocks)
			f := features(rt.Config(), prompt, 300)
			s := NewScratch(8)
			var res Reservation
			b.ReportAllocs()
			for b.Loop() {
				_, r := rt.Route(f, cands, s, nil, &res)
				r.Release()
			}
		})
	}
}
