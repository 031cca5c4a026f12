package module

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ramjet-llm/ramjet/metrics"
	"github.com/ramjet-llm/ramjet/selection"
)

// BenchmarkObserverStream is the metrics' cost for one streamed response
// of n SSE chunks (a chunk of about 150 bytes per token) with usage: the
// observer's creation, the selection hook, every Write and End.
func BenchmarkObserverStream(b *testing.B) {
	for _, n := range []int{16, 256} {
		var body []string
		for i := range n {
			body = append(body, fmt.Sprintf("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}],\"usage\":null}\n\n", i))
		}
		body = append(body, "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":20,\"total_tokens\":320,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\n",
			"data: [DONE]\n\n")
		size := 0
		for _, c := range body {
			size += len(c)
		}
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			processMetrics().Models.Add("m")
			h := http.Header{"Content-Type": {"text/event-stream"}}
			chunks := make([][]byte, len(body))
			for i, c := range body {
				chunks[i] = []byte(c)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			vars := map[string]any{}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader("{}"))
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, vars))
			st := &reqState{routeIDHdr: []string{"00112233aabbccdd"}, model: "m",
				decision: selection.Decision{Index: 0, Reason: selection.ReasonAffinity, Overlap: 1024}}
			for b.Loop() {
				clear(vars)
				o := newResponseObserver(r, st, processMetrics())
				observeSelect(processMetrics(), st, metrics.MonoNow())
				o.WriteHeader(200, h)
				for _, c := range chunks {
					o.Write(c)
				}
				o.End(200, nil)
			}
		})
	}
}
