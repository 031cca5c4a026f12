package fleetsim

import (
	"fmt"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// The flip probe (ramjet-precise@flip=K) decides request K/10 without
// replica K%10 and changes no decision before it (the requests before it
// go where the plain policy sends them; their timings may move with what
// follows), and that request goes elsewhere.
func TestRamjetPreciseFlipKey(t *testing.T) {
	w := generate(t, "shared-prefix", workload.Options{Seed: 1, Scale: 0.1})
	plain, err := NewPolicy("ramjet-precise", 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := runPolicy(t, w, plain, 4, 1)
	id := len(want.Records) / 2
	rep := want.Records[id].Replica
	q, err := NewPolicy(fmt.Sprintf("ramjet-precise@flip=%d", id*10+rep), 1, selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got := runPolicy(t, w, q, 4, 1)
	for i := 0; i < id; i++ {
		if want.Records[i].Replica != got.Records[i].Replica {
			t.Fatalf("request %d before the flip went to %d, want %d", i, got.Records[i].Replica, want.Records[i].Replica)
		}
	}
	if got.Records[id].Replica == rep {
		t.Errorf("request %d went to replica %d with it left out", id, rep)
	}
	if _, err := NewPolicy("ramjet-precise@flip=x", 1, selection.Config{}); err == nil {
		t.Error("flip=x: no error")
	}
}
