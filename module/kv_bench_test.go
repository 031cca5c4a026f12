package module

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ramjet-llm/ramjet/duration"
	"github.com/ramjet-llm/ramjet/fleetstate"
	"github.com/ramjet-llm/ramjet/kvindex"
)

// BenchmarkSelectKV is BenchmarkSelect with the precise index on: every
// replica's feed is fresh (events applied directly), the /tokenize
// preflight (the ramjet handler's part, run here ahead of Select) answers
// from its cache after the first round (32 distinct conversations), and
// each decision runs the request key, the block keys, Annotate, Pick and
// Predict.
func BenchmarkSelectKV(b *testing.B) {
	for _, size := range []int{1 << 10, 16 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("body=%dKiB/replicas=8", size>>10), func(b *testing.B) {
			const n = 8
			tok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var req struct {
					Messages json.RawMessage `json:"messages"`
				}
				json.NewDecoder(r.Body).Decode(&req)
				toks := make([]int, len(req.Messages)/4)
				for i := range toks {
					toks[i] = int(req.Messages[4*i])
				}
				json.NewEncoder(w).Encode(map[string]any{"tokens": toks, "count": len(toks)})
			}))
			defer tok.Close()
			pool := newTestPool(n)
			kv := &kvindex.Settings{TokenizeURL: tok.URL, TokenizeTimeout: duration.Duration(5 * time.Second)}
			for _, up := range pool {
				// Nothing publishes there: the feeds stay down and the
				// index is filled directly below.
				kv.Engines = append(kv.Engines, kvindex.FeedSpec{Upstream: up.Dial, Events: "tcp://127.0.0.1:1"})
			}
			p := &RamjetSelection{PolicySettings: fleetstate.PolicySettings{StateKey: "bench-kv-" + strconv.Itoa(size), KV: kv}}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			if err := p.Provision(ctx); err != nil {
				b.Fatal(err)
			}
			defer p.Cleanup()
			p.logger = zap.NewNop()
			// Every replica holds a first block of its own: fresh feeds.
			for i, up := range pool {
				r, _ := p.kv.p.Index().Lookup(up.Dial)
				p.kv.p.Index().Apply(r, &kvindex.Batch{Events: []kvindex.Event{{Kind: kvindex.KindBlockStored,
					BlockHashes: []uint64{uint64(i + 1)}, TokenIDs: make([]uint32, 16), BlockSize: 16}}})
			}
			bodies := make([][]byte, 32)
			for i := range bodies {
				bodies[i] = chatJSON(size, "user "+strconv.Itoa(i))
			}
			b.SetBytes(int64(len(bodies[0])))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ctx, cancel := context.WithCancel(context.Background())
				r := newTestRequest(ctx, bodies[i%len(bodies)])
				// The handler's part: the preflight, ahead of Select.
				p.fleet.kv.Load().preflight(r, observedState(r), p.x, p.logger)
				if p.Select(pool, r, nil) == nil {
					b.Fatal("no upstream")
				}
				r.Body.Close()
				cancel()
				i++
			}
			b.StopTimer()
			if p.kv.preciseN() == 0 || p.kv.p.Tokenizer().CacheHits() == 0 {
				b.Fatalf("precise %d approximate %d cache hits %d", p.kv.preciseN(), p.kv.approxN(), p.kv.p.Tokenizer().CacheHits())
			}
		})
	}
}
