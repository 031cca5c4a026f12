package fleetsim

import (
	"slices"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/workload"
)

func TestZeroWaitOrder(t *testing.T) {
	// Two closed-loop sessions: in trace order one after the other; with
	// zero service time they interleave by think time.
	tr := workload.Trace{
		{ID: 0, At: 0, After: -1, Session: 0, Input: 10, Output: 1},
		{ID: 1, At: 0, After: 0, Think: 5, Session: 0, Turn: 1, Input: 20, Output: 1},
		{ID: 2, At: 1, After: -1, Session: 1, Input: 10, Output: 1},
		{ID: 3, At: 1, After: 2, Think: 1, Session: 1, Turn: 1, Input: 20, Output: 1},
	}
	if got, want := ZeroWaitOrder(tr), []int{0, 2, 3, 1}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestPooledOracle(t *testing.T) {
	w, err := workload.Generate("agent-fleet", workload.Options{Seed: 1, Scale: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	inf, _, _ := OracleShare(w, 1, 16)
	big, _, _ := PooledOracleShare(w, 1, 16, 1<<30)
	small, _, _ := PooledOracleShare(w, 1, 16, 200000/16)
	tiny, _, _ := PooledOracleShare(w, 1, 16, 100)
	t.Logf("infinite %.3f, pooled unbounded %.3f, 200k tokens %.3f, 100 blocks %.3f", inf, big, small, tiny)
	if big != inf {
		t.Errorf("an unbounded pooled cache gives %.4f, the infinite oracle %.4f", big, inf)
	}
	// 48 agents of up to 30k tokens of context do not fit 200k tokens.
	if !(tiny < small && small < inf) {
		t.Errorf("pooled shares not ordered by capacity: %.3f, %.3f, %.3f", tiny, small, inf)
	}
}
