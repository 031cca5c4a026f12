package module

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ramjet-llm/ramjet/kvindex"
)

// TestForeignPrefillWired runs foreign_prefill through the configuration
// path (Caddyfile -> JSON -> Provision): on by default with kv and
// engine_metrics both on, off otherwise unless set, off with "off"; "on"
// without kv and a word other than on|off are errors.
func TestForeignPrefillWired(t *testing.T) {
	// Nothing listens on these: the feeds and the scrapes only retry.
	const kv = "kv_events 127.0.0.1:9 tcp://127.0.0.1:9\n"
	const em = "engine_metrics 1h\n"
	tests := []struct {
		name, block string
		want        bool
	}{
		{"bare", "", false},
		{"kv only", kv, false},
		{"kv and engine_metrics", kv + em, true},
		{"kv and engine_metrics, off", kv + em + "foreign_prefill off\n", false},
		{"kv, on", kv + "foreign_prefill on\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "foreign_" + strings.NewReplacer(" ", "_", ",", "").Replace(tt.name)
			p, err := provisionKeep(t, "ramjet {\n state_key "+key+"\n "+tt.block+"}")
			if err != nil {
				t.Fatal(err)
			}
			defer p.Cleanup()
			if got := p.foreignFor() != nil; got != tt.want {
				t.Errorf("foreign prefill on: %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := provisionSpillErr(t, "ramjet {\n foreign_prefill on\n}"); err == nil || !strings.Contains(err.Error(), "foreign_prefill") {
		t.Errorf("foreign_prefill on without kv: error %v, want one naming foreign_prefill", err)
	}
	var p RamjetSelection
	if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser("ramjet {\n foreign_prefill maybe\n}")); err == nil {
		t.Error("foreign_prefill maybe: no error")
	}
}

// TestForeignPrefillFeeds: a block run the engine's KV feed applies beyond
// this instance's own pending prefill reaches the policy's router as
// external prefill and the metric's totals; a reload that turns
// foreign_prefill off (same feeds, same state) takes it back to 0.
func TestForeignPrefillFeeds(t *testing.T) {
	const block = "ramjet {\n state_key foreign_feeds\n kv_events 127.0.0.1:9 tcp://127.0.0.1:9\n engine_metrics 1h\n"
	p, err := provisionKeep(t, block+"}")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup()
	fp := p.foreignFor()
	if fp == nil {
		t.Fatal("foreign_prefill is not on by default with kv and engine_metrics")
	}
	s, err := p.rt.Register("127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	if !p.kv.p.Bind(s, "127.0.0.1:9") {
		t.Fatal("no feed for 127.0.0.1:9")
	}
	r, _ := p.kv.x.Lookup("127.0.0.1:9")
	bs := p.kv.x.BlockSize()
	toks := make([]uint32, 8*bs)
	for i := range toks {
		toks[i] = uint32(i)
	}
	p.kv.x.Apply(r, &kvindex.Batch{Events: []kvindex.Event{{Kind: kvindex.KindBlockStored, Medium: "GPU",
		BlockHashes: []uint64{1, 2, 3, 4, 5, 6, 7, 8}, TokenIDs: toks, BlockSize: bs}}})
	if got := p.rt.ExternalPrefill(s); got != int64(8*bs) {
		t.Fatalf("external prefill %d after a foreign run of %d tokens", got, 8*bs)
	}
	if tok, runs := p.kv.fp.Counted(); tok != uint64(8*bs) || runs != 1 {
		t.Errorf("counted %d tokens in %d runs", tok, runs)
	}

	q, err := provisionKeep(t, block+" foreign_prefill off\n}")
	if err != nil {
		t.Fatal(err)
	}
	defer q.Cleanup()
	if q.kv != p.kv {
		t.Fatal("the reload started new feeds")
	}
	if q.foreignFor() != nil || p.foreignFor() != nil {
		t.Error("foreign_prefill off after the reload, but an estimate is still fed")
	}
	if got := q.rt.ExternalPrefill(s); got != 0 {
		t.Errorf("external prefill %d after turning foreign_prefill off", got)
	}
}
