package kvindex

import (
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// With several instances (the router has seen the others), a context this
// router's request stored and that request ended, evicted and recomputed
// later by another instance's request, is that instance's prefill, though
// the index still marks the blocks as this router's (Own); while a request
// of this router holds the blocks, their recomputation is its own, also for
// blocks the replica already held at the decision (a cached prefix evicted
// while the request queued). A run that leaves its chain is another
// instance's request's, the part within it included (bench/EXPERIMENTS.md,
// section 115).
func TestForeignOwnInflight(t *testing.T) {
	const bs, blocks = 16, 8
	now := time.Unix(1000, 0)
	p, rt, s := preciseOnA(t, bs, &now)
	x := p.Index()
	ra, _ := x.Lookup("a")
	fp := selection.NewForeignPrefill()
	fp.OwnInflight = true
	fp.SetRouter(rt)
	p.SetForeign(fp)
	rt.SetExternalLoad(s, 1, 0, 0) // another instance's request on a
	if !rt.SawOthers() {
		t.Fatal("the engine's load did not show the other instance")
	}
	toks := make([]uint32, blocks*bs)
	hashes := make([]uint64, blocks)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	for i := range hashes {
		hashes[i] = uint64(100 + i)
	}
	keys := x.Keys(nil, 0, toks)
	evictStore := func() {
		now = now.Add(10 * time.Millisecond)
		x.Apply(ra, batchOf(Event{Kind: KindBlockRemoved, BlockHashes: hashes, Medium: "GPU"}))
		now = now.Add(10 * time.Millisecond)
		x.Apply(ra, batchOf(storedEv(0, false, bs, toks, hashes...)))
	}

	// This router's request stores the prompt (credited), ends.
	x.Hold(ra, keys, time.Minute)
	fp.Routed(s, blocks*bs)
	fp.FirstToken(s, now)
	x.Apply(ra, batchOf(storedEv(0, false, bs, toks, hashes...)))
	if got := x.Inflight(); got != blocks {
		t.Fatalf("Inflight %d while the request runs, want %d", got, blocks)
	}
	x.Release(ra, keys, time.Second)
	if got := x.Inflight(); got != 0 {
		t.Fatalf("Inflight %d after its end, want 0", got)
	}
	if !x.Own(ra, keys[0]) {
		t.Fatal("the stored blocks lost their own mark")
	}
	// Another instance's request recomputes the context, long after.
	now = now.Add(time.Minute)
	evictStore()
	if tok, runs := fp.Counted(); tok != blocks*bs || runs != 1 {
		t.Fatalf("the context recomputed by another instance: %d foreign tokens in %d runs, want %d in 1", tok, runs, blocks*bs)
	}
	// This router's next request on the context, cached at its decision,
	// queues while the engine evicts and recomputes it: its own.
	x.Hold(ra, keys, time.Minute)
	evictStore()
	if tok, runs := fp.Counted(); tok != blocks*bs || runs != 1 {
		t.Fatalf("own request's cached prefix recomputed: %d foreign tokens in %d runs, want %d in 1 (the earlier)", tok, runs, blocks*bs)
	}
	// Another instance's request extends the context past the chain this
	// router's request holds: its run is all foreign.
	more := append(append([]uint32(nil), toks...), make([]uint32, 4*bs)...)
	for i := len(toks); i < len(more); i++ {
		more[i] = uint32(50000 + i)
	}
	moreHashes := append(append([]uint64(nil), hashes...), 200, 201, 202, 203)
	now = now.Add(10 * time.Millisecond)
	x.Apply(ra, batchOf(Event{Kind: KindBlockRemoved, BlockHashes: hashes, Medium: "GPU"}))
	x.Apply(ra, batchOf(storedEv(0, false, bs, more, moreHashes...)))
	if tok, runs := fp.Counted(); tok != (2*blocks+4)*bs || runs != 2 {
		t.Fatalf("a run past the held chain: %d foreign tokens in %d runs, want %d in 2", tok, runs, (2*blocks+4)*bs)
	}
	// Past its ttl the hold is gone.
	now = now.Add(2 * time.Minute)
	evictStore()
	if _, runs := fp.Counted(); runs != 3 {
		t.Fatalf("%d foreign runs after the hold's ttl, want 3", runs)
	}
}

// MaxInflight bounds the pairs of requests in flight: past it a hold's new
// pairs are dropped and counted, those past their ttl swept.
func TestInflightBound(t *testing.T) {
	now := time.Unix(1000, 0)
	x := New(Config{BlockSize: 4, MaxInflight: 4, Now: func() time.Time { return now }})
	r, _ := x.Register("a")
	x.Hold(r, []uint64{1, 2, 3}, time.Minute)
	if got := x.Inflight(); got != 0 {
		t.Fatalf("Inflight %d while off, want 0", got)
	}
	x.Release(r, []uint64{1, 2, 3}, time.Second)
	x.trackInflight(true)
	x.Hold(r, []uint64{1, 2, 3}, time.Minute)
	x.Hold(r, []uint64{3, 4, 5, 6}, time.Minute)
	if got, drop := x.Inflight(), x.InflightDropped(); got != 4 || drop != 2 {
		t.Fatalf("Inflight %d, dropped %d; want 4 and 2", got, drop)
	}
	x.Release(r, []uint64{1, 2, 3}, time.Second)
	if got := x.Inflight(); got != 2 { // 3 still held by the second
		t.Fatalf("Inflight %d after the first's end, want 2", got)
	}
	now = now.Add(2 * time.Minute)
	x.Hold(r, []uint64{7, 8, 9}, time.Minute)
	if got, drop := x.Inflight(), x.InflightDropped(); got != 3 || drop != 2 {
		t.Fatalf("after the ttl: Inflight %d, dropped %d; want 3 and 2", got, drop)
	}
}
