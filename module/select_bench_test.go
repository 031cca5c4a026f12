package module

import (
	"context"
	"strconv"
	"testing"

	"github.com/ramjet-llm/ramjet/selection"
)

// BenchmarkDecide is the Select hot path once the body is parsed: cached
// features, pool view, candidates, Route (Pick, Reserve, Learn) with
// pooled scratch, released at once.
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{2, 8, 64} {
		b.Run("replicas="+strconv.Itoa(n), func(b *testing.B) {
			p := newTestPolicy(b, "bench-decide-"+strconv.Itoa(n))
			pool := newTestPool(n)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := newTestRequest(ctx, chatJSON(256<<10, "hello"))
			p.Select(pool, r, nil)
			st := lookupRequest(r)
			var storage selection.Reservation
			b.ReportAllocs()
			for b.Loop() {
				st.body.Acquire()
				f := st.features(p.x, selection.EndpointChat)
				_, res := p.decide(pool, p.viewFor(pool), st, f, &storage, false)
				res.Release()
				st.body.Release()
			}
		})
	}
}

// BenchmarkSelect is Select end to end on an in-memory request: request
// state, bounded body read into a pooled buffer, parse and fingerprint,
// Pick, Reserve, Learn, headers, and the release when the request context
// ends. The request construction (context, vars map, cancel) is included;
// BenchmarkRequestSetup measures it alone.
func BenchmarkSelect(b *testing.B) {
	for _, size := range []int{1 << 10, 16 << 10, 64 << 10, 256 << 10} {
		for _, n := range []int{8, 64} {
			b.Run("body="+strconv.Itoa(size>>10)+"KiB/replicas="+strconv.Itoa(n), func(b *testing.B) {
				p := newTestPolicy(b, "bench-select")
				pool := newTestPool(n)
				// 32 conversations sharing the system prompt, as a
				// steady stream of turns.
				bodies := make([][]byte, 32)
				for i := range bodies {
					bodies[i] = chatJSON(size, "user "+strconv.Itoa(i))
				}
				b.SetBytes(int64(len(bodies[0])))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					ctx, cancel := context.WithCancel(context.Background())
					r := newTestRequest(ctx, bodies[i%len(bodies)])
					if p.Select(pool, r, nil) == nil {
						b.Fatal("no upstream")
					}
					r.Body.Close() // as the transport does
					cancel()
					i++
				}
			})
		}
	}
}

// BenchmarkRequestSetup is the part of BenchmarkSelect that builds the
// request (not Select's cost).
func BenchmarkRequestSetup(b *testing.B) {
	body := chatJSON(1<<10, "x")
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		r := newTestRequest(ctx, body)
		_ = r
		cancel()
	}
}

// BenchmarkSelectObserved is BenchmarkSelect in the chain the ramjet
// directive builds: the ramjet handler created the request's state before
// Select (observedState, included in the loop), so that no
// context.AfterFunc is needed and the first attempt's reservation lives in
// that state.
func BenchmarkSelectObserved(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10} {
		b.Run("body="+strconv.Itoa(size>>10)+"KiB/replicas=8", func(b *testing.B) {
			p := newTestPolicy(b, "bench-select-observed")
			pool := newTestPool(8)
			bodies := make([][]byte, 32)
			for i := range bodies {
				bodies[i] = chatJSON(size, "user "+strconv.Itoa(i))
			}
			b.SetBytes(int64(len(bodies[0])))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ctx, cancel := context.WithCancel(context.Background())
				r := newTestRequest(ctx, bodies[i%len(bodies)])
				st, _ := observedState(r)
				if p.Select(pool, r, nil) == nil {
					b.Fatal("no upstream")
				}
				r.Body.Close()         // as the transport does
				st.recycle(new(error)) // as the handler does
				cancel()
				i++
			}
		})
	}
}
