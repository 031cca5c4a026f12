package fleetstate

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/selection"
)

func TestNewView(t *testing.T) {
	f, err := New(DefaultStateKey, PoolKey(DefaultStateKey, selection.Config{}), selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f.SetSecret([]byte("s"))
	dials := []string{"a:1", "b:1", "a:1", "c:1"}
	profiles := map[string]selection.Profile{"a:1#1": selection.ProfileSpeculative, "c:1": selection.ProfileSpeculative}
	v := f.NewView(dials, profiles, func(err error) { t.Errorf("registration failed: %v", err) })
	if diff := cmp.Diff([]string{"a:1#0", "b:1", "a:1#1", "c:1"}, v.Keys); diff != "" {
		t.Errorf("keys (-want +got)\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, -1, 1, -1}, v.Ranks); diff != "" {
		t.Errorf("ranks (-want +got)\n%s", diff)
	}
	if diff := cmp.Diff([][]string{{"0"}, nil, {"1"}, nil}, v.RankHdr); diff != "" {
		t.Errorf("rank headers (-want +got)\n%s", diff)
	}
	wantProf := []selection.Profile{selection.ProfileStandard, selection.ProfileStandard, selection.ProfileSpeculative, selection.ProfileSpeculative}
	if diff := cmp.Diff(wantProf, v.Profiles); diff != "" {
		t.Errorf("profiles (-want +got)\n%s", diff)
	}
	for i, k := range v.Keys {
		slot, ok := f.Base().Lookup(k)
		if !ok || slot != v.Slots[i] {
			t.Errorf("%s: slot %d, registered %d %v", k, v.Slots[i], slot, ok)
		}
		if v.IDs[i] != f.RouteID(k) || v.IDs[i] == "" || len(v.IDHdr[i]) != 1 || v.IDHdr[i][0] != v.IDs[i] {
			t.Errorf("%s: id %q header %q, want route id %q", k, v.IDs[i], v.IDHdr[i], f.RouteID(k))
		}
	}
	if v.Untracked {
		t.Error("untracked with room in the router")
	}
	if diff := cmp.Diff(v.Keys, v.Tracked()); diff != "" {
		t.Errorf("tracked (-want +got)\n%s", diff)
	}
	// The same list again: the same slots and ids.
	again := f.NewView(dials, nil, func(err error) { t.Errorf("registration failed: %v", err) })
	if diff := cmp.Diff(v.Slots, again.Slots); diff != "" {
		t.Errorf("slots of the same list (-want +got)\n%s", diff)
	}
}

// TestNewViewFull: replicas past selection.MaxReplicas have no slot, are
// reported and left out of Tracked.
func TestNewViewFull(t *testing.T) {
	f, err := New(DefaultStateKey, PoolKey(DefaultStateKey, selection.Config{}), selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dials := make([]string, selection.MaxReplicas+2)
	for i := range dials {
		dials[i] = fmt.Sprintf("h%d:1", i)
	}
	var failed int
	v := f.NewView(dials, nil, func(error) { failed++ })
	if failed != 2 || !v.Untracked {
		t.Fatalf("failed %d untracked %v, want 2 and true", failed, v.Untracked)
	}
	if v.Slots[len(dials)-1] >= 0 || len(v.Tracked()) != selection.MaxReplicas {
		t.Errorf("last slot %d, %d tracked; want -1 and %d", v.Slots[len(dials)-1], len(v.Tracked()), selection.MaxReplicas)
	}
}
