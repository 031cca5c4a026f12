package fleetstate

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

func newTestFleet(t *testing.T) *Fleet {
	t.Helper()
	f, err := New(DefaultStateKey, PoolKey(DefaultStateKey, selection.Config{}), selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.SetSecret([]byte("k"))
	return f
}

func register(t *testing.T, f *Fleet, key string) selection.Slot {
	t.Helper()
	s, _, err := f.Register(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// overlapOn is the approximate index's overlap (tokens) of body on slot s.
func overlapOn(t *testing.T, rt *selection.Router, s selection.Slot, body string) int {
	t.Helper()
	x := rt.Extractor()
	feat := x.NewFeatures()
	if err := x.Parse(selection.EndpointChat, []byte(body), feat); err != nil {
		t.Fatal(err)
	}
	sc := selection.NewScratch(1)
	rt.Pick(feat, []selection.Candidate{{Slot: s, Usable: true}}, sc)
	return sc.Overlap[0]
}

// TestUnregisterReusedSlotStartsCold: the replica registered in the slot
// of one that left inherits nothing keyed by the slot: no index entries,
// a fresh route id, no ejection or failure history, no external load or
// engine-reported capacity; the hooks ran with the departed key; the
// snapshot lists only current replicas.
func TestUnregisterReusedSlotStartsCold(t *testing.T) {
	f := newTestFleet(t)
	rt := f.Router()
	a := register(t, f, "127.0.0.1:1")
	b := register(t, f, "127.0.0.1:2")
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("warm prefix on a. ", 200) + `"}]}`
	x := rt.Extractor()
	feat := x.NewFeatures()
	if err := x.Parse(selection.EndpointChat, []byte(body), feat); err != nil {
		t.Fatal(err)
	}
	rt.Learn(feat, a)
	if overlapOn(t, rt, a, body) == 0 {
		t.Fatal("the index learned nothing on a")
	}
	od := f.Detector()
	for i := 0; i < selection.DefaultConsecutiveFailures; i++ {
		od.Failure(a, selection.FailStatus, 2)
	}
	if !od.Ejected(a) || od.EjectedCount() != 1 {
		t.Fatal("a was not ejected")
	}
	rt.SetExternalLoad(a, 3, 4, 5000)
	rt.SetCapacity(a, 1<<20)
	oldID := f.SlotID(a)

	var hooked []string
	remove := f.OnUnregister(func(s selection.Slot, key string) { hooked = append(hooked, fmt.Sprint(s, " ", key)) })
	defer remove()
	if !f.Unregister("127.0.0.1:1") || f.Unregister("127.0.0.1:1") {
		t.Fatal("Unregister did not report the first call only")
	}
	if f.SlotID(a) != "" || f.RouteID("127.0.0.1:1") != "" {
		t.Error("the departed replica still has a route id")
	}
	c := register(t, f, "127.0.0.1:3")
	if c != a {
		t.Fatalf("new replica in slot %d, want the freed slot %d", c, a)
	}
	if got := f.SlotID(c); got != RouteID([]byte("k"), "127.0.0.1:3") || got == oldID || f.RouteID("127.0.0.1:3") != got {
		t.Errorf("reused slot id %q, want the new key's %q (old %q)", got, RouteID([]byte("k"), "127.0.0.1:3"), oldID)
	}
	if got := overlapOn(t, rt, c, body); got != 0 {
		t.Errorf("the new replica inherits %d tokens of overlap", got)
	}
	if !od.Usable(c) || od.Ejected(c) || od.EjectedCount() != 0 || od.Ejections(c, selection.FailStatus) != 0 {
		t.Errorf("the new replica inherits the ejection: usable %v ejected %v count %d", od.Usable(c), od.Ejected(c), od.EjectedCount())
	}
	// One failure less than the threshold: no ejection (no inherited count).
	for i := 0; i < selection.DefaultConsecutiveFailures-1; i++ {
		od.Failure(c, selection.FailStatus, 2)
	}
	if od.Ejected(c) {
		t.Error("the new replica was ejected by an inherited failure count")
	}
	if r, w, kv := rt.ExternalLoad(c); r+w+kv != 0 {
		t.Errorf("inherited external load %d %d %d", r, w, kv)
	}
	if got := rt.Capacity(c); got != 0 {
		t.Errorf("inherited capacity %d tokens, want the default (0: unbounded)", got)
	}
	if want := fmt.Sprint(a, " 127.0.0.1:1"); len(hooked) != 1 || hooked[0] != want {
		t.Errorf("hooks ran %q, want [%q]", hooked, want)
	}
	if f.Departures() != 1 {
		t.Errorf("Departures = %d, want 1", f.Departures())
	}
	snap := f.Snapshot(f.Replicas())
	if len(snap.Replicas) != 2 || snap.Replicas[0].ID != f.SlotID(c) || snap.Replicas[1].ID != f.SlotID(b) {
		t.Errorf("snapshot replicas %+v, want the two current ones", snap.Replicas)
	}
	remove()
	f.Unregister("127.0.0.1:2")
	if len(hooked) != 1 {
		t.Error("a removed hook ran")
	}
	if snap := f.Snapshot(f.Replicas()); len(snap.Replicas) != 1 {
		t.Errorf("snapshot after b left: %+v", snap.Replicas)
	}
}

// TestDepart: a replica departs only once no pool listed it for the grace
// period and no request holds a reservation on it; listing it again within
// the grace keeps it (and what it learned).
func TestDepart(t *testing.T) {
	f := newTestFleet(t)
	a := register(t, f, "127.0.0.1:1")
	register(t, f, "127.0.0.1:2")
	const grace = 30 * time.Second
	t0 := time.Now()
	pool := map[string]bool{"127.0.0.1:2": true}
	listed := func(k string) bool { return pool[k] }

	if gone := f.Depart(listed, t0.Add(grace/2), grace); gone != nil {
		t.Fatalf("departed within the grace: %v", gone)
	}
	// Listed again (a DNS flap): the grace starts over.
	pool["127.0.0.1:1"] = true
	f.Depart(listed, t0.Add(grace/2), grace)
	delete(pool, "127.0.0.1:1")
	if gone := f.Depart(listed, t0.Add(grace+time.Second), grace); gone != nil {
		t.Fatalf("departed %v though listed %v ago", gone, grace/2+time.Second)
	}
	// Past the grace, a reservation holds it.
	res := f.Router().Reserve(a, 100)
	if gone := f.Depart(listed, t0.Add(2*grace), grace); gone != nil {
		t.Fatalf("departed %v while a request holds a reservation", gone)
	}
	res.Release()
	gone := f.Depart(listed, t0.Add(2*grace), grace)
	if len(gone) != 1 || gone[0] != "127.0.0.1:1" {
		t.Fatalf("Depart = %v, want [127.0.0.1:1]", gone)
	}
	if _, ok := f.Router().Lookup("127.0.0.1:1"); ok || f.Router().Registered() != 1 || f.Departures() != 1 {
		t.Errorf("after departure: registered %d, departures %d", f.Router().Registered(), f.Departures())
	}
	// Registering counts as listed: a pool being built is not swept.
	register(t, f, "127.0.0.1:3")
	if gone := f.Depart(listed, time.Now().Add(grace/2), grace); gone != nil {
		t.Errorf("swept a just-registered replica: %v", gone)
	}
}

// TestChurnPastMaxReplicas: a fleet of two whose replicas are replaced
// (new addresses) many more times than selection.MaxReplicas keeps every
// new replica registered, in the two freed slots.
func TestChurnPastMaxReplicas(t *testing.T) {
	f := newTestFleet(t)
	now := time.Now()
	pool := map[string]bool{}
	for g := 0; g < 2*selection.MaxReplicas; g++ {
		clear(pool)
		for j := 0; j < 2; j++ {
			key := fmt.Sprintf("127.0.0.1:%d", 2*g+j)
			pool[key] = true
			if s := register(t, f, key); s > 3 {
				t.Fatalf("generation %d: slot %d, want one of the first few (slots are reused)", g, s)
			}
		}
		now = now.Add(time.Minute)
		f.Depart(func(k string) bool { return pool[k] }, now, time.Second)
	}
	if n := f.Router().Registered(); n != 2 {
		t.Errorf("%d replicas registered, want 2", n)
	}
	if d := f.Departures(); d != uint64(2*2*selection.MaxReplicas-2) {
		t.Errorf("Departures = %d, want %d", d, 2*2*selection.MaxReplicas-2)
	}
}

// TestChurnConcurrent: registrations and departures race reservations;
// afterwards every slot's route id is its key's and no load is left over.
// Run with -race.
func TestChurnConcurrent(t *testing.T) {
	f := newTestFleet(t)
	rt := f.Router()
	var stop atomic.Bool
	var wg, departer sync.WaitGroup
	var listedMu sync.Mutex
	listed := map[string]bool{}
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 3000; i++ {
				key := fmt.Sprintf("127.0.0.1:%d", 1000*w+i%50)
				s, id, err := f.Register(key)
				if err != nil {
					t.Error(err)
					return
				}
				if id != RouteID([]byte("k"), key) {
					t.Errorf("Register(%s) id %s, want its own", key, id)
					return
				}
				res := rt.Reserve(s, 10)
				listedMu.Lock()
				listed[key] = i%3 != 0
				listedMu.Unlock()
				res.Release()
			}
		}(w)
	}
	departer.Add(1)
	go func() {
		defer departer.Done()
		for !stop.Load() {
			listedMu.Lock()
			keep := make(map[string]bool, len(listed))
			for k, v := range listed {
				keep[k] = v
			}
			listedMu.Unlock()
			f.Depart(func(k string) bool { return keep[k] }, time.Now().Add(time.Hour), time.Minute)
		}
	}()
	wg.Wait()
	stop.Store(true)
	departer.Wait()
	for _, r := range f.Replicas() {
		if r.Key != "" && r.ID != RouteID([]byte("k"), r.Key) {
			t.Errorf("slot %d (%s) has id %s, not its own", r.Slot, r.Key, r.ID)
		}
		if r.Inflight != 0 {
			t.Errorf("slot %d holds %d requests after every release", r.Slot, r.Inflight)
		}
	}
}
