package selection

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// appendCandidatesRef is AppendCandidates as it was written before its
// checks moved to a pass of their own: one loop, Usable asked for every
// available replica.
func appendCandidatesRef(dst []Candidate, slots []Slot, profiles []Profile, available func(i int) bool, od *Outlier, tried *SlotSet) []Candidate {
	usable, admitted := 0, 0
	start := len(dst)
	for i, slot := range slots {
		ok := slot >= 0 && available(i)
		if ok && !od.Usable(slot) {
			ok = false
		} else if ok {
			admitted++
		}
		if ok && tried != nil && tried.Has(slot) {
			ok = false
		}
		if ok {
			usable++
		}
		dst = append(dst, Candidate{Slot: slot, Usable: ok, Profile: profiles[i]})
	}
	if usable == 0 {
		for i, slot := range slots {
			ok := slot >= 0 && available(i)
			dst[start+i].Usable = ok && (admitted == 0 || od.Usable(slot))
		}
	}
	return dst
}

// TestAppendCandidatesMatchesRef holds AppendCandidates to the one-loop
// form on random pools: slots missing, replicas unavailable, ejected
// (still out, half-open with and without a probe in flight) and tried.
func TestAppendCandidatesMatchesRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Unix(1000, 0)
	for iter := range 5000 {
		n := rng.IntN(10)
		od := NewOutlier(OutlierConfig{}, func() time.Time { return now })
		slots, profiles, avail := make([]Slot, n), make([]Profile, n), make([]bool, n)
		var tried *SlotSet
		if rng.IntN(3) == 0 {
			tried = new(SlotSet)
		}
		for i := range n {
			slots[i] = Slot(rng.IntN(MaxReplicas+1) - 1) // -1 (not routed) .. MaxReplicas-1
			if rng.IntN(4) == 0 {
				slots[i] = Slot(rng.IntN(4))
			}
			profiles[i] = Profile(rng.IntN(2))
			avail[i] = rng.IntN(5) != 0
			s := slots[i]
			if s < 0 {
				continue
			}
			k := rng.IntN(4)
			if k < 3 && od.until[s].Load() == 0 {
				od.ejected.Add(1) // as Failure counts it (None)
			}
			switch k {
			case 0: // still ejected
				od.until[s].Store(now.UnixNano() + int64(time.Second))
			case 1: // half-open, no probe
				od.until[s].Store(now.UnixNano() - 1)
			case 2: // half-open, probe in flight
				od.until[s].Store(now.UnixNano() - 1)
				od.probing[s].Store(now.UnixNano())
			}
			if tried != nil && rng.IntN(3) == 0 {
				tried.Add(s)
			}
		}
		available := func(i int) bool { return avail[i] }
		prefix := []Candidate{{Slot: 7, Usable: true}}
		got := AppendCandidates(slices.Clone(prefix), slots, profiles, available, od, tried)
		want := appendCandidatesRef(slices.Clone(prefix), slots, profiles, available, od, tried)
		if !slices.Equal(got, want) {
			t.Fatalf("iteration %d: slots %v available %v:\n got %+v\nwant %+v", iter, slots, avail, got, want)
		}
	}
}
