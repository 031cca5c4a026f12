package selection

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// BenchmarkParse measures parse + fingerprint (Extractor.Parse, default
// knobs) by body size, on the agent-style body (chatBodyOfSize: tools, a
// long system prompt with escapes, many short turns), on a one-string
// body and on a body of tool results dense with escapes (toolBodyOfSize), each beside xxhash.Sum64 over the same bytes in the same run: the
// ratio of the two MB/s figures is the parser's cost in units of hashing.
// cpu-ns/op is the process's CPU time per op, steadier than ns/op on a
// shared machine.
func BenchmarkParse(b *testing.B) {
	c := Config{}
	c.SetDefaults()
	x := NewExtractor(c)
	f := x.NewFeatures()
	// The overhead bench's small request (module's benchBody(1 << 10)):
	// a 1 KiB system prompt and a short user turn.
	small := []byte(smallChatBody)
	b.Run("body=small/size=1KiB/parse", func(b *testing.B) {
		b.SetBytes(int64(len(small)))
		b.ReportAllocs()
		cpu := processCPU()
		for b.Loop() {
			if err := x.Parse(EndpointChat, small, f); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
	for _, shape := range []string{"agent", "onestring", "tool"} {
		for _, kib := range []int{4, 64, 256} {
			body := []byte(chatBodyOfSize(kib << 10))
			switch shape {
			case "onestring":
				body = []byte(oneStringBody(kib << 10))
			case "tool":
				body = []byte(toolBodyOfSize(kib << 10))
			}
			b.Run(fmt.Sprintf("body=%s/size=%dKiB/parse", shape, kib), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				cpu := processCPU()
				for b.Loop() {
					if err := x.Parse(EndpointChat, body, f); err != nil {
						b.Fatal(err)
					}
				}
				reportCPU(b, cpu)
			})
			b.Run(fmt.Sprintf("body=%s/size=%dKiB/xxhash", shape, kib), func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				var sink uint64
				cpu := processCPU()
				for b.Loop() {
					sink += xxhash.Sum64(body)
				}
				reportCPU(b, cpu)
				_ = sink
			})
		}
	}
}

// smallChatBody is the overhead bench's small request as module's
// benchBody(1 << 10) builds it.
var smallChatBody = `{"model":"qwen3-32b","messages":[{"role":"system","content":"` +
	strings.Repeat("You are a helpful assistant. ", (1<<10)/29) + `"},{"role":"user","content":"hi"}],"max_tokens":64}`

// toolBodyOfSize is a chat body of about n bytes whose turns are tool
// results holding JSON: an escape every few bytes (\", \n, \t).
func toolBodyOfSize(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"qwen3-32b","messages":[{"role":"system","content":"You are a coding agent."}`)
	for turn := 0; b.Len() < n-200; turn++ {
		fmt.Fprintf(&b, `,{"role":"tool","tool_call_id":"call_%d","content":"`, turn)
		for i := 0; i < 20 && b.Len() < n-100; i++ {
			fmt.Fprintf(&b, `{\"path\":\"internal/server/handler_%d.go\",\"line\":%d,\"text\":\"\\tif err != nil {\"}\n`, turn, i)
		}
		b.WriteString(`"}`)
	}
	b.WriteString(`]}`)
	return b.String()
}

// oneStringBody is a chat body of about n bytes whose prompt is one long
// string without escapes.
func oneStringBody(n int) string {
	return `{"model":"qwen3-32b","messages":[{"role":"user","content":"` +
		strings.Repeat("You are a helpful assistant. ", n/29) + `"}],"max_tokens":64}`
}

// BenchmarkPick measures index lookup + scoring, by prompt length, replica
// count and warmth: "shared" is the common case (every replica holds the
// shared system prompt, a quarter of the prompt, and one holds the whole
// conversation); "staggered" is the worst case for the bisection (every
// replica holds the prompt to a different depth).
func BenchmarkPick(b *testing.B) {
	for _, warm := range []string{"shared", "staggered"} {
		for _, blocks := range []int{16, 1024} {
			for _, n := range []int{8, 64, 256, 1024} {
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

// BenchmarkRouteSmall is the overhead bench's small request as the router
// sees it in module's BenchmarkWholeChain: Route of the parsed 1 KiB body
// (smallChatBody) over 8 replicas with default knobs, Observe of the
// engine stand-in's answer (12 prompt tokens, 8 cached, 1 completion),
// Release.
func BenchmarkRouteSmall(b *testing.B) {
	rt, cands := newTestRouter(b, Config{}, 8)
	x := rt.Extractor()
	f := x.NewFeatures()
	if err := x.Parse(EndpointChat, []byte(smallChatBody), f); err != nil {
		b.Fatal(err)
	}
	s := NewScratch(8)
	var res Reservation
	b.ReportAllocs()
	for b.Loop() {
		_, r := rt.Route(f, cands, s, nil, &res)
		rt.Observe(r, 12, 8, 1)
		r.Release()
		res = Reservation{}
	}
}
