package enginesim

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkInstantChat measures whole requests through an instant
// simulator over loopback HTTP (the floor an overhead benchmark sits on):
// a 1k-token chat prompt, 16 output tokens, 8 clients in parallel.
var benchPar = 4 // x GOMAXPROCS clients (8 on 2 cores)

func BenchmarkInstantChat(b *testing.B) {
	for _, stream := range []bool{false, true} {
		name := "json"
		if stream {
			name = "sse"
		}
		b.Run(name, func(b *testing.B) {
			s, err := Start(context.Background(), Options{Instant: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			body := `{"model":"qwen3-32b","max_tokens":16,"stream":` + map[bool]string{false: "false", true: "true"}[stream] +
				`,"messages":[{"role":"system","content":"` + strings.Repeat("abcd", 1000) + `"},{"role":"user","content":"go"}]}`
			tr := &http.Transport{MaxIdleConnsPerHost: 64}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			b.SetParallelism(benchPar)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := c.Post(s.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != 200 {
						b.Errorf("status %d", res.StatusCode)
						return
					}
				}
			})
		})
	}
}
