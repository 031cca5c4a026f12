package selection

import (
	"fmt"
	"testing"
)

// A fleet of MaxReplicas replicas routes: Depths agrees with a linear scan
// for slots spread over every word of the holder sets, and Pick finds the
// deepest replica.
func TestIndexDepthsAtMaxReplicas(t *testing.T) {
	x := NewIndex(64 << 20)
	fam := blocksOf(9, 300)
	var interest mask
	for s := Slot(0); s < MaxReplicas; s++ {
		x.Learn(fam[:(int(s)*53)%301], s)
		if s%3 != 1 {
			interest.Add(s)
		}
	}
	var depth [MaxReplicas]int32
	x.Depths(fam, interest, &depth)
	for s := Slot(0); s < MaxReplicas; s++ {
		want := 0
		if interest.Has(s) {
			for _, b := range fam {
				if !x.holds(b, s) {
					break
				}
				want++
			}
		}
		if int(depth[s]) != want {
			t.Errorf("slot %d: depth %d, linear %d", s, depth[s], want)
		}
	}
}

func TestPickAtMaxReplicas(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, MaxReplicas)
	if _, err := rt.Register("one too many:8000"); err == nil {
		t.Fatal("Register past MaxReplicas succeeded")
	}
	prompt := blocksOf(3, 64)
	rt.Index().Learn(prompt[:32], cands[700].Slot)
	rt.Index().Learn(prompt[:8], cands[5].Slot)
	d := rt.Pick(features(rt.Config(), prompt, 0), cands, NewScratch(len(cands)))
	if d.Slot != cands[700].Slot || d.Overlap != 32*16 || d.Reason != ReasonAffinity {
		t.Fatalf("picked slot %d overlap %d (%v), want slot 700 overlap 512", d.Slot, d.Overlap, d.Reason)
	}
}

// Unregister drops a departed replica's index entries and load; its slot is
// reused by the next Register, and a reservation made before does not
// count against the new replica when it ends.
func TestUnregisterFreesSlot(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, PrefixTokens: 16 * 1024}, 3)
	prompt := blocksOf(5, 40)
	f := features(rt.Config(), prompt, 0)
	rt.Learn(f, cands[1].Slot)
	res := rt.Reserve(cands[1].Slot, 500)
	if !rt.Unregister("127.0.0.1:8001") {
		t.Fatal("Unregister of a registered key reported false")
	}
	if rt.Unregister("127.0.0.1:8001") {
		t.Fatal("second Unregister reported true")
	}
	if got := rt.Index().Entries(); got != 0 {
		t.Fatalf("index keeps %d blocks of the departed replica", got)
	}
	if in, pend := rt.Load(cands[1].Slot); in != 0 || pend != 0 {
		t.Fatalf("departed replica's load %d/%d, want 0/0", in, pend)
	}
	s, err := rt.Register("127.0.0.1:8009")
	if err != nil || s != cands[1].Slot {
		t.Fatalf("Register after Unregister: slot %d, %v; want the freed slot %d", s, err, cands[1].Slot)
	}
	if rt.Key(s) != "127.0.0.1:8009" || rt.Registered() != 3 || rt.Len() != 3 {
		t.Fatalf("key %q, registered %d, len %d", rt.Key(s), rt.Registered(), rt.Len())
	}
	res2 := rt.Reserve(s, 100)
	res.Release() // the old replica's reservation ends after the slot was reused
	if in, pend := rt.Load(s); in != 1 || pend != 100 {
		t.Fatalf("new replica's load %d/%d after an old reservation ended, want 1/100", in, pend)
	}
	res2.Release()
	d := rt.Pick(f, cands, NewScratch(3))
	if d.Overlap != 0 {
		t.Fatalf("new replica inherited overlap %d", d.Overlap)
	}
}

// A churning fleet (two replicas at a time, each generation new) keeps
// routing past MaxReplicas distinct keys when departed ones are
// unregistered, and the index stays as narrow as the fleet.
func TestUnregisterChurn(t *testing.T) {
	rt, err := NewRouter(Config{BlockTokens: 16, PrefixTokens: 16 * 1024})
	if err != nil {
		t.Fatal(err)
	}
	s := NewScratch(2)
	prev := []string{}
	for g := 0; g < 3*MaxReplicas; g++ {
		keys := []string{fmt.Sprintf("g%da:8000", g), fmt.Sprintf("g%db:8000", g)}
		cands := make([]Candidate, 2)
		for i, k := range keys {
			sl, err := rt.Register(k)
			if err != nil {
				t.Fatalf("generation %d: %v", g, err)
			}
			cands[i] = Candidate{Slot: sl, Usable: true}
		}
		for _, k := range prev {
			rt.Unregister(k)
		}
		prev = keys
		var res Reservation
		d, r := rt.Route(features(rt.Config(), blocksOf(uint64(g+1), 8), 0), cands, s, nil, &res)
		if d.Index < 0 {
			t.Fatalf("generation %d: no pick", g)
		}
		r.Release()
	}
	if rt.Len() > 4 {
		t.Fatalf("slots in use grew to %d for a fleet of 2", rt.Len())
	}
}
