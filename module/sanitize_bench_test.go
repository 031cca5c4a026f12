package module

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkProbeModel measures the guard's JSON check and model probe by
// body size (the rest of the guard is header edits and one body copy).
func BenchmarkProbeModel(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		body := []byte(`{"model":"qwen3-32b","messages":[{"role":"system","content":"` +
			strings.Repeat("You are a helpful assistant. ", size/29) + `"},{"role":"user","content":"hi"}],"max_tokens":64}`)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, ae := probeModel(body); ae != nil {
					b.Fatal(ae)
				}
			}
		})
	}
}
