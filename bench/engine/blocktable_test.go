package engine

import (
	"math/rand/v2"
	"testing"
)

// TestBlockTableMatchesMap drives the table and a Go map with the same
// random inserts, overwrites, deletes (present and absent) and resets,
// on keys crowded into few home slots as well as spread ones, and checks
// every lookup and the size after every operation.
func TestBlockTableMatchesMap(t *testing.T) {
	tests := []struct {
		name string
		key  func(r *rand.Rand) uint64
	}{
		{"spread", func(r *rand.Rand) uint64 { return r.Uint64() }},
		{"few keys", func(r *rand.Rand) uint64 { return r.Uint64N(300) }},
		{"colliding", func(r *rand.Rand) uint64 { return r.Uint64N(64) << 40 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var tab blockTable
			ref := map[uint64]*block{}
			var keys []uint64
			for op := 0; op < 200000; op++ {
				switch x := r.IntN(100); {
				case x < 50:
					k := tt.key(r)
					b := &block{hash: k}
					tab.put(k, b)
					ref[k] = b
					keys = append(keys, k)
				case x < 90 && len(keys) > 0:
					k := keys[r.IntN(len(keys))]
					tab.del(k)
					delete(ref, k)
				case x < 99:
					k := tt.key(r)
					tab.del(k)
					delete(ref, k)
				default:
					if r.IntN(50) == 0 {
						tab.reset()
						clear(ref)
						keys = keys[:0]
					}
				}
				if tab.len() != len(ref) {
					t.Fatalf("op %d: len %d, want %d", op, tab.len(), len(ref))
				}
				if op%97 == 0 {
					for k, b := range ref {
						if got := tab.get(k); got != b {
							t.Fatalf("op %d: get(%#x) = %p, want %p", op, k, got, b)
						}
					}
					for range 20 {
						k := tt.key(r)
						if got := tab.get(k); got != ref[k] {
							t.Fatalf("op %d: get(%#x) = %p, want %p", op, k, got, ref[k])
						}
					}
				}
			}
			if 2*tab.len() > len(tab.vals) {
				t.Fatalf("table %d of %d slots: more than half full", tab.len(), len(tab.vals))
			}
		})
	}
}

// BenchmarkChurn measures a full engine under prefix-cache churn: a small
// KV cache (4,096 blocks) and a stream of distinct 4k-token prompts, so
// that every admission evicts and every computed block is new. This is
// the fleet simulation's steady state under reduced KV capacity.
func BenchmarkChurn(b *testing.B) {
	e := New(Config{CapacityTokens: 4096 * 16})
	next := uint64(0)
	submit := func() {
		prompt := SyntheticTokens(nil, next+1, 4096) // the engine keeps it
		if err := e.Submit(Request{ID: next, Prompt: prompt, MaxTokens: 16}); err != nil {
			b.Fatal(err)
		}
		next++
	}
	for range 8 {
		submit()
	}
	var evs []Event
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		evs, _ = e.Step(evs[:0])
		for _, ev := range evs {
			if ev.Kind == EventFinished {
				submit()
			}
		}
	}
	b.ReportMetric(float64(e.Stats().CachedBlocks), "cached-blocks")
}
