package selection

import (
	"testing"
)

// BenchmarkLearnLong is the learn of a 1,024-block prompt (256 KiB at the
// default block size and chars per token), per op:
//
//   - resent: the overhead benchmark's long-256KiB cycle as the router
//     sees it (Route of one of 64 distinct prompts over 8 replicas with
//     default knobs, Observe of an engine that reports no cached tokens,
//     Release). The index soon learns that nothing is kept: each Route
//     learns its prompt anew and the replica's horizon drops as many old
//     beliefs.
//   - fresh-full: Index.Learn of a prompt the index never saw, on one of
//     8 replicas, into an index whose budget is full: each new block
//     evicts the least recently used one.
//
// Besides ns/op (wall time), each reports cpu-ns/op: the process's CPU
// time per op, which a loaded machine inflates less (another process
// running in between counts in the wall time only).
func BenchmarkLearnLong(b *testing.B) {
	const n = 1024
	b.Run("resent", func(b *testing.B) {
		rt, cands := newTestRouter(b, Config{}, 8)
		prompts := make([]*Features, 64)
		for i := range prompts {
			prompts[i] = features(rt.Config(), blocksOf(uint64(i+1), n), 1)
		}
		s := NewScratch(8)
		var res Reservation
		for i := range 2 * 64 * 8 { // to the steady state
			_, r := rt.Route(prompts[i%64], cands, s, nil, &res)
			rt.Observe(r, 0, 0, 0)
			r.Release()
			res = Reservation{}
		}
		routeUncachedLoop(b, rt, cands, prompts, s, &res)
	})
	b.Run("fresh-full", func(b *testing.B) {
		// A budget of about 32 prompts; 128 prompts go round, so each
		// is long evicted when it comes again.
		x := NewIndex(32 * n * entryBytes)
		prompts := make([][]uint64, 128)
		for i := range prompts {
			prompts[i] = blocksOf(uint64(i+1), n)
		}
		for i := range 2 * len(prompts) {
			x.Learn(prompts[i%len(prompts)], Slot(i%8))
		}
		if x.Evictions() == 0 {
			b.Fatal("the index is not full")
		}
		b.ReportAllocs()
		cpu := processCPU()
		i := 0
		for b.Loop() {
			x.Learn(prompts[i%len(prompts)], Slot(i%8))
			i++
		}
		reportCPU(b, cpu)
	})
}

// reportCPU reports the process's CPU time since start (processCPU) per
// op as cpu-ns/op.
func reportCPU(b *testing.B, start int64) {
	if end := processCPU(); end > 0 && b.N > 0 {
		b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
	}
}
