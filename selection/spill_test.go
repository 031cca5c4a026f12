package selection

import (
	"testing"

	"github.com/cespare/xxhash/v2"
)

func TestInstancePosition(t *testing.T) {
	g := uint64(0x9E3779B97F4A7C15)
	tests := []struct {
		give string
		want uint64
	}{
		{"", 0},
		{"0", 0},
		{"ramjet-0", 0},
		{"ramjet-1", g},
		{"ramjet_2", 2 * g},
		{"pod.3", 3 * g},
		{"7", 7 * g},
		{"host-a0", xxhash.Sum64String("host-a0")},                                         // digits not after a separator
		{"3f2a9c81", xxhash.Sum64String("3f2a9c81")},                                       // a container id
		{"ramjet-", xxhash.Sum64String("ramjet-")},                                         // no digits
		{"ramjet-99999999999999999999", xxhash.Sum64String("ramjet-99999999999999999999")}, // overflows uint64
	}
	for _, tt := range tests {
		if got := InstancePosition(tt.give); got != tt.want {
			t.Errorf("InstancePosition(%q) = %#x, want %#x", tt.give, got, tt.want)
		}
	}
}

// burst routes perInst same-prefix requests of a cold prompt through each
// router in turn (each its own reservations) and returns the slots each
// request went to, request by request, and the distinct slots used.
func burst(t *testing.T, routers []*Router, cands []Candidate, perInst int) ([]Slot, int) {
	t.Helper()
	f := features(routers[0].Config(), blocksOf(7, 64), 100)
	s := NewScratch(len(cands))
	var got []Slot
	used := map[Slot]bool{}
	for range perInst {
		for _, rt := range routers {
			d, _ := rt.Route(f, cands, s, nil, nil)
			got = append(got, d.Slot)
			used[d.Slot] = true
		}
	}
	return got, len(used)
}

// Four independent routers (own index, own reservations, same replica
// keys) named by ordinals agree on a cold prompt's first replica and
// spill its burst over 8 of 8 replicas; unnamed, they walk one shared
// spill order and pile onto 3.
func TestSpillSpreadsABurstOverInstances(t *testing.T) {
	c := Config{BlockTokens: 16}
	mk := func(ids ...string) ([]*Router, []Candidate) {
		var rts []*Router
		var cands []Candidate
		for _, id := range ids {
			rt, cs := newTestRouter(t, c, 8)
			rt.SetInstance(id)
			rts, cands = append(rts, rt), cs
		}
		return rts, cands
	}
	rts, cands := mk("ramjet-0", "ramjet-1", "ramjet-2", "ramjet-3")
	got, used := burst(t, rts, cands, 3)
	for k := 1; k < 4; k++ {
		if got[k] != got[0] {
			t.Fatalf("first requests went to %v: the instances disagree on the cold prompt's replica", got[:4])
		}
	}
	if used < 7 {
		t.Errorf("named instances: burst over %d of 8 replicas (%v), want >= 7", used, got)
	}
	rts, cands = mk("", "", "", "")
	if _, used := burst(t, rts, cands, 3); used != 3 {
		t.Errorf("one shared spill order: burst over %d of 8 replicas, want the pile-up on 3", used)
	}
}

// The position changes spills only: a cold prompt and a tie among equally
// warm replicas go where every instance sends them, and position 0 is the
// rule without SetInstance, decision for decision.
func TestSpillOnlyOnSpills(t *testing.T) {
	c := Config{BlockTokens: 16}
	plain, cands := newTestRouter(t, c, 8)
	named, _ := newTestRouter(t, c, 8)
	named.SetInstance("edge-b")
	zero, _ := newTestRouter(t, c, 8)
	zero.SetInstance("ramjet-0")
	if zero.Instance() != 0 || named.Instance() == 0 {
		t.Fatalf("positions %#x, %#x", zero.Instance(), named.Instance())
	}
	s := NewScratch(8)
	for p := uint64(1); p <= 32; p++ {
		f := features(c, blocksOf(p, 8), 100)
		if a, b := plain.Pick(f, cands, s).Slot, named.Pick(f, cands, s).Slot; a != b {
			t.Fatalf("prompt %d cold: %d vs %d", p, a, b)
		}
		// Two replicas equally warm, none loaded: the shared order.
		for _, rt := range []*Router{plain, named} {
			rt.Learn(f, cands[p%8].Slot)
			rt.Learn(f, cands[(p+3)%8].Slot)
		}
		if a, b := plain.Pick(f, cands, s).Slot, named.Pick(f, cands, s).Slot; a != b {
			t.Fatalf("prompt %d warm tie: %d vs %d", p, a, b)
		}
	}
	// Position 0: the same decisions as no position, reservations and all.
	fresh, _ := newTestRouter(t, c, 8)
	a, _ := burst(t, []*Router{fresh}, cands, 12)
	b, _ := burst(t, []*Router{zero}, cands, 12)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("position 0 request %d went to %d, unnamed to %d", i, b[i], a[i])
		}
	}
	// Retuned routers keep the instance's position.
	rt2, err := named.Retune(Config{BlockTokens: 16, AffinityCap: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if rt2.Instance() != named.Instance() || named.WithOptions(Options{}).Instance() != named.Instance() {
		t.Fatal("Retune or WithOptions lost the instance position")
	}
}

// A spill allocates nothing once the scratch has grown.
func TestSpillAllocs(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 64)
	rt.SetInstance("ramjet-3")
	// Without the warm hold, which keeps the second request on the first's
	// replica (one request in flight, its queue no longer than a cold one's).
	rt = rt.WithOptions(Options{WarmHold: -1})
	f := features(rt.Config(), blocksOf(1, 64), 100)
	s := NewScratch(len(cands))
	var first, second Reservation
	spills := 0
	if n := testing.AllocsPerRun(200, func() {
		// A cold prompt, then the same prompt while its replica is busy:
		// a spill. Then back to cold.
		d1, _ := rt.Route(f, cands, s, nil, &first)
		d2, _ := rt.Route(f, cands, s, nil, &second)
		if d2.Reason == ReasonLoadOverride && d2.Tie == TieRendezvous {
			spills++
		}
		first.Release()
		second.Release()
		rt.Forget(d1.Slot)
		rt.Forget(d2.Slot)
	}); n != 0 {
		t.Fatalf("Route with a spill: %v allocs, want 0", n)
	}
	if spills < 200 {
		t.Fatalf("%d spills in 201 rounds: the test does not exercise the spill", spills)
	}
}
