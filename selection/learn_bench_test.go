package selection

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// BenchmarkLearnPrompts measures Index.learn as the overhead benchmark
// drives it: 64 distinct prompts of 512 blocks, each sent to its own one of
// 8 replicas, round after round. horizon=0 is the warm case (every prompt
// already believed where it goes); a short horizon is what an engine that
// reports no cached tokens teaches the index (Router.Observe): each learn
// then touches 512 blocks of which all but the first few are dropped at
// once.
func BenchmarkLearnPrompts(b *testing.B) {
	prompts := make([][]uint64, 64)
	for i := range prompts {
		prompts[i] = blocksOf(uint64(i+1), 512)
	}
	for _, horizon := range []int64{0, 2, 64} {
		b.Run(fmt.Sprintf("horizon=%d", horizon), func(b *testing.B) {
			x := NewIndex(256 << 20)
			for s := range Slot(8) {
				x.SetHorizon(s, horizon)
			}
			b.ReportAllocs()
			cpu := processCPU()
			i := 0
			for b.Loop() {
				x.learn(prompts[i%64], Slot(i%8), 1)
				i++
			}
			reportCPU(b, cpu)
		})
	}
}

// uncachedRouter is the RouteUncached benchmarks' fleet: 8 replicas
// (default knobs) with the learn queue at queue blocks (0: off), and 64
// distinct prompts of n blocks.
func uncachedRouter(b *testing.B, queue, n int) (*Router, []Candidate, []*Features) {
	rt, cands := newTestRouter(b, Config{}, 8)
	rt.Index().SetLearnQueue(queue)
	prompts := make([]*Features, 64)
	for i := range prompts {
		prompts[i] = features(rt.Config(), blocksOf(uint64(i+1), n), 1)
	}
	return rt, cands, prompts
}

// BenchmarkRouteUncached is one request of the overhead benchmark's
// long-256KiB scenario as the router sees it: Route of one of 64 distinct
// 512-block prompts over 8 replicas (default knobs), then Observe of an
// engine that reports no cached tokens (the echo engine), then Release.
// The index soon learns that nothing is kept: every Route learns 512 new
// blocks and drops as many old ones.
func BenchmarkRouteUncached(b *testing.B) {
	rt, cands, prompts := uncachedRouter(b, 0, 512)
	s := NewScratch(8)
	var res Reservation
	routeUncachedLoop(b, rt, cands, prompts, s, &res)
}

// routeUncachedLoop is the benchmark loop of an engine that reports no
// cached tokens: Route, Observe(0 cached), Release, over prompts in turn;
// it reports allocations and cpu-ns/op.
func routeUncachedLoop(b *testing.B, rt *Router, cands []Candidate, prompts []*Features, s *Scratch, res *Reservation) {
	b.ReportAllocs()
	cpu := processCPU()
	i := 0
	for b.Loop() {
		_, r := rt.Route(prompts[i%len(prompts)], cands, s, nil, res)
		rt.Observe(r, 0, 0, 0)
		r.Release()
		*res = Reservation{}
		i++
	}
	reportCPU(b, cpu)
}

// BenchmarkRouteUncachedQueued is BenchmarkRouteUncached with the module's
// learn queue: its process CPU time against BenchmarkRouteUncached's is
// what the hand-over to the applier costs in all.
func BenchmarkRouteUncachedQueued(b *testing.B) {
	rt, cands, prompts := uncachedRouter(b, DefaultLearnQueueBlocks, 512)
	s := NewScratch(8)
	var res Reservation
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		_, r := rt.Route(prompts[i%64], cands, s, nil, &res)
		rt.Observe(r, 0, 0, 0)
		r.Release()
		i++
	}
	rt.Index().settle()
}

// BenchmarkRouteUncachedPath is BenchmarkRouteUncached's request path:
// the time from Route's call to its return (what delays forwarding), with
// the learn inline and with it queued. The queued learn is applied, and
// Observe and Release made, outside the timed part, as the applier
// goroutine and the end of the response do in the module.
func BenchmarkRouteUncachedPath(b *testing.B) {
	for _, queue := range []int{0, DefaultLearnQueueBlocks} {
		b.Run(fmt.Sprintf("queue=%d", queue), func(b *testing.B) {
			rt, cands, prompts := uncachedRouter(b, queue, 1024)
			s := NewScratch(8)
			var res Reservation
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_, r := rt.Route(prompts[i%64], cands, s, nil, &res)
				b.StopTimer()
				rt.Index().settle()
				rt.Observe(r, 0, 0, 0)
				r.Release()
				b.StartTimer()
				i++
			}
		})
	}
}

// BenchmarkRouteUncachedParallel is BenchmarkRouteUncached from every P at
// once (a saturated proxy, the overhead run at concurrency 16 and 32), with
// the learn inline and queued: with no idle P, starting the applier wakes
// no thread, and the queued learns are applied by the applier or by the
// next Pick that finds them, as the inline learn would have cost.
func BenchmarkRouteUncachedParallel(b *testing.B) {
	for _, queue := range []int{0, DefaultLearnQueueBlocks} {
		b.Run(fmt.Sprintf("queue=%d", queue), func(b *testing.B) {
			rt, cands, prompts := uncachedRouter(b, queue, 512)
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				s := NewScratch(8)
				var res Reservation
				for pb.Next() {
					_, r := rt.Route(prompts[next.Add(1)%64], cands, s, nil, &res)
					rt.Observe(r, 0, 0, 0)
					r.Release()
				}
			})
			rt.Index().settle()
		})
	}
}

// BenchmarkReplied is the charge of one answer's reply (Observe's
// completion tokens at a response's end): 16 blocks (1,024 tokens at the
// default block size) on one of 8 replicas whose capacity is full, so
// that each charge also drops as many old beliefs.
func BenchmarkReplied(b *testing.B) {
	x := NewIndex(256 << 20)
	for s := range Slot(8) {
		x.SetCapacity(s, 4096)
	}
	for i := range 64 {
		x.Learn(blocksOf(uint64(i+1), 512), Slot(i%8))
	}
	b.ReportAllocs()
	cpu := processCPU()
	i := 0
	for b.Loop() {
		x.Replied(uint64(i), Slot(i%8), 16)
		i++
	}
	reportCPU(b, cpu)
}
