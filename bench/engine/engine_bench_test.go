package engine

import (
	"testing"
)

// BenchmarkSteadyStep measures one scheduler step of a full engine: 26
// running sequences of 2k-token prompts (half sharing a 1k prefix), each
// finished request replaced at once, 128 output tokens each.
func BenchmarkSteadyStep(b *testing.B) {
	e := New(Config{})
	shared := SyntheticTokens(nil, 1, 1024)
	prompts := make([][]uint32, 64)
	for i := range prompts {
		p := append([]uint32(nil), shared[:(i%2)*1024]...)
		prompts[i] = SyntheticTokens(p, uint64(i+2), 2048-len(p))
	}
	next := uint64(0)
	submit := func() {
		if err := e.Submit(Request{ID: next, Prompt: prompts[next%64], MaxTokens: 128}); err != nil {
			b.Fatal(err)
		}
		next++
	}
	for i := 0; i < 26; i++ {
		submit()
	}
	var evs []Event
	tokens := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		evs, _ = e.Step(evs[:0])
		for _, ev := range evs {
			tokens += ev.NewTokens
			if ev.Kind == EventFinished {
				submit()
			}
		}
	}
	b.ReportMetric(float64(tokens)/float64(b.N), "tokens/step")
	b.ReportMetric(float64(e.Now().Seconds())/float64(b.N)*1e3, "sim-ms/step")
}

// BenchmarkAdmit32k measures a whole request with a 32k-token prompt whose
// prefix is cached: admission (hashing 2000 blocks and looking them up),
// one step for the last block and the first token, release.
func BenchmarkAdmit32k(b *testing.B) {
	e := New(Config{})
	p := SyntheticTokens(nil, 1, 32000)
	if err := e.Submit(Request{ID: 0, Prompt: p, MaxTokens: 1}); err != nil {
		b.Fatal(err)
	}
	for {
		if _, ok := e.Step(nil); !ok {
			break
		}
	}
	b.SetBytes(int64(len(p) * 4))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := e.Submit(Request{ID: uint64(i + 1), Prompt: p, MaxTokens: 1}); err != nil {
			b.Fatal(err)
		}
		for {
			if _, ok := e.Step(nil); !ok {
				break
			}
		}
	}
	if st := e.Stats(); st.Finished != uint64(b.N)+1 || st.PrefixHits < uint64(b.N)*31984 {
		b.Fatalf("requests did not run from cache: %+v", st)
	}
}
