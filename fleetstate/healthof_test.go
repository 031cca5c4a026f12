package fleetstate

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/selection"
)

func TestHealthOfWithoutProxy(t *testing.T) {
	got := HealthOf([]string{"a:1", "b:1"}, []string{"ida", "idb"}, nil, nil, nil, nil)
	want := NewHealthReport([]ReplicaHealth{{ID: "ida", Reason: "not_found"}, {ID: "idb", Reason: "not_found"}})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	if got.Status != StatusUnhealthy {
		t.Errorf("status %q", got.Status)
	}
}

func TestHealthOfWithoutPolicy(t *testing.T) {
	ups := []UpstreamHealth{{Healthy: true, InFlight: 2}, {InFlight: 1, Full: true, Out: "active_check"}}
	got := HealthOf([]string{"a:1", "b:1"}, []string{"ida", "idb"}, ups, nil, nil, nil)
	want := NewHealthReport([]ReplicaHealth{{ID: "ida", Healthy: true, InFlight: 2}, {ID: "idb", InFlight: 1, Full: true, Reason: "active_check"}})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	if got.Status != StatusDegraded {
		t.Errorf("status %q", got.Status)
	}
}

// TestHealthOfWithPolicy: with the policy's fleet, replicas are named by
// its route ids; ejection and integrity hold a usable upstream out, an
// observed integrity reason is reported on a replica kept in, and each kv
// feed's health is attached.
func TestHealthOfWithPolicy(t *testing.T) {
	f, err := New(DefaultStateKey, PoolKey(DefaultStateKey, selection.Config{}), selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.SetSecret([]byte("secret"))
	dials := []string{"a:1", "b:1", "c:1", "d:1"}
	v := f.NewView(dials, nil, func(err error) { t.Fatal(err) })
	od := f.Detector()
	for i := 0; i < selection.DefaultConsecutiveFailures; i++ {
		od.Failure(v.Slots[0], selection.FailStatus, len(dials))
	}
	integ := map[string]*IntegrityReport{"b:1": {Out: true, Reason: "model_mismatch"}, "c:1": {Reason: "spec_collapse"},
		"d:1": {Out: true, Reason: "fenced"}}
	feeds := map[string]*KVFeedHealth{"c:1": {Healthy: true}}
	ups := []UpstreamHealth{{Healthy: true}, {Healthy: true}, {Healthy: true, InFlight: 3}, {Out: "passive_failures"}}
	got := HealthOf(dials, []string{"x", "x", "x", "x"}, ups, f, func(key string) *IntegrityReport { return integ[key] }, feeds)
	want := NewHealthReport([]ReplicaHealth{
		{ID: v.IDs[0], Reason: "ejected"},
		{ID: v.IDs[1], Reason: "integrity", Integrity: "model_mismatch"},
		{ID: v.IDs[2], Healthy: true, InFlight: 3, Integrity: "spec_collapse", KV: &KVFeedHealth{Healthy: true}},
		{ID: v.IDs[3], Reason: "passive_failures"},
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

// TestHealthOfPanic: with the policy's fleet, every replica out but one
// only by passive failures is degraded (the policy's panic routing serves
// it), not unhealthy; a full one, one out by its active check or one
// outlier detection ejected does not count (and the last says "ejected");
// without the policy nothing routes in panic.
func TestHealthOfPanic(t *testing.T) {
	f, err := New(DefaultStateKey, PoolKey(DefaultStateKey, selection.Config{}), selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dials := []string{"a:1", "b:1", "c:1"}
	v := f.NewView(dials, nil, func(err error) { t.Fatal(err) })
	for range selection.DefaultConsecutiveFailures {
		f.Detector().Failure(v.Slots[2], selection.FailTimeout, len(dials))
	}
	ids := []string{"ida", "idb", "idc"}
	ejected := UpstreamHealth{Out: "passive_failures"} // c:1, also ejected by outlier detection
	for _, c := range []struct {
		name   string
		ups    []UpstreamHealth
		f      *Fleet
		status string
		panic  bool
	}{
		{"passive", []UpstreamHealth{{Out: "active_check"}, {Out: "passive_failures"}, ejected}, f, StatusDegraded, true},
		{"passive full", []UpstreamHealth{{Out: "active_check"}, {Out: "passive_failures", Full: true}, ejected}, f, StatusUnhealthy, false},
		{"active only", []UpstreamHealth{{Out: "active_check"}, {Out: "active_check"}, ejected}, f, StatusUnhealthy, false},
		{"no policy", []UpstreamHealth{{Out: "passive_failures"}, {Out: "passive_failures"}, ejected}, nil, StatusUnhealthy, false},
		{"some healthy", []UpstreamHealth{{Healthy: true}, {Out: "passive_failures"}, ejected}, f, StatusDegraded, false},
	} {
		got := HealthOf(dials, ids, c.ups, c.f, func(string) *IntegrityReport { return nil }, nil)
		if got.Status != c.status || got.Panic != c.panic {
			t.Errorf("%s: status %q panic %v, want %q %v", c.name, got.Status, got.Panic, c.status, c.panic)
		}
		want := "ejected"
		if c.f == nil {
			want = "passive_failures"
		}
		if r := got.Replicas[2].Reason; r != want {
			t.Errorf("%s: the ejected replica's reason %q, want %q", c.name, r, want)
		}
	}
}
