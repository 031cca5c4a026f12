package kvindex

import (
	"testing"
	"time"
)

// TestWaitWarm: under the wait rule with an engine's eviction just now, a
// lone instance with WaitWarm (tokenize_wait warm) routes at once a prompt
// the estimate credits to no replica and waits for one it credits; without
// WaitWarm, or once other instances are seen, both wait.
func TestWaitWarm(t *testing.T) {
	now := time.Unix(100, 0)
	p, rt, slots := estimatedOn(t, PreciseConfig{
		Index:    Config{BlockSize: 4, Now: func() time.Time { return now }},
		WaitAuto: true, WaitWarm: true,
	}, 1, "a", "b")
	s0 := slots[0]
	warm := promptOf(rt, []uint32{1, 2, 3, 4, 5, 6, 7, 8})
	cold := promptOf(rt, []uint32{21, 22, 23, 24, 25, 26, 27, 28})
	rt.Learn(warm, s0)
	if p.WaitFor(cold) || p.WaitFor(warm) {
		t.Fatal("nothing evicted: want no wait")
	}
	ra, _ := p.Index().Lookup("a")
	p.Index().Apply(ra, batchOf(storedEv(0, false, 4, []uint32{9, 9, 9, 9}, 1)))
	p.Index().Apply(ra, batchOf(Event{Kind: KindBlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU"}))
	if !p.WaitPreflight() {
		t.Fatal("a block evicted just now: want the rule to wait")
	}
	if p.WaitFor(cold) {
		t.Error("a prompt the estimate credits to no replica: want no wait")
	}
	if !p.WaitFor(warm) {
		t.Error("a prompt the estimate credits to a: want a wait")
	}
	p.cfg.WaitWarm = false
	if !p.WaitFor(cold) {
		t.Error("without WaitWarm: want a wait")
	}
	p.cfg.WaitWarm = true
	rt.SetExternalLoad(s0, 1, 0, 0) // load this instance did not route: another instance
	if !p.WaitFor(cold) {
		t.Error("other instances seen: want a wait")
	}
}
