package kvindex

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestPreciseTokenizeCarriesTokenAndScheme checks that the preflight goes
// to an engine whose feed is fresh, over the engine's own scheme (https
// here), with the upstream token, and the rank header of that replica.
func TestPreciseTokenizeCarriesTokenAndScheme(t *testing.T) {
	var auth, rank atomic.Value
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		rank.Store(r.Header.Get("X-data-parallel-rank"))
		if r.URL.Path != "/tokenize" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"tokens": []int{1, 2, 3}, "count": 3})
	}))
	defer srv.Close()
	p, err := NewPrecise(PreciseConfig{
		Index: Config{BlockSize: 4},
		Engines: []PreciseEngine{
			{Feed: Endpoint{Replica: "a"}, BaseURL: "https://127.0.0.1:1"}, // never fresh
			{Feed: Endpoint{Replica: "b"}, BaseURL: srv.URL},
		},
		Token:     "s3cret",
		Tokenizer: TokenizerConfig{Client: srv.Client(), Timeout: 5 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Start(context.Background())

	if p.Ready() {
		t.Fatal("ready before any feed applied an event")
	}
	if _, err := p.Tokenize(context.Background(), 1, TokenizeRequest{Model: "m", Prompt: json.RawMessage(`"x"`)}); err == nil {
		t.Fatal("tokenized with no fresh feed")
	}
	rb, _ := p.Index().Lookup("b")
	p.Index().Apply(rb, batchOf(storedEv(0, false, 4, []uint32{9, 9, 9, 9}, 7)))
	if !p.Ready() {
		t.Fatal("not ready after b's feed applied an event")
	}
	for i := range 4 { // every turn lands on the only fresh engine
		toks, err := p.Tokenize(context.Background(), uint64(10+i), TokenizeRequest{Model: "m", Prompt: json.RawMessage(`"x"`)})
		if err != nil || len(toks) != 3 {
			t.Fatalf("tokenize: %v %v", toks, err)
		}
	}
	if got := auth.Load(); got != "Bearer s3cret" {
		t.Errorf("Authorization %q, want the upstream token", got)
	}
	if _, err := NewPrecise(PreciseConfig{Engines: []PreciseEngine{{Feed: Endpoint{Replica: "c"}, BaseURL: "127.0.0.1:80"}}}); err == nil {
		t.Error("a base URL without a scheme was accepted")
	}
}

// TestPreciseAnnotator checks the selection.Annotator contract through
// Router.Route: exact overlaps for bound slots with fresh feeds only,
// predictions only after a precise decision, and no allocation.
func TestPreciseAnnotator(t *testing.T) {
	now := time.Unix(100, 0)
	p, err := NewPrecise(PreciseConfig{
		Index:   Config{BlockSize: 4, Now: func() time.Time { return now }},
		Engines: []PreciseEngine{{Feed: Endpoint{Replica: "a"}}, {Feed: Endpoint{Replica: "b"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := selection.NewRouter(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var cands []selection.Candidate
	for _, k := range []string{"a", "b", "c"} {
		s, _ := rt.Register(k)
		if bound := p.Bind(s, k); bound != (k != "c") {
			t.Fatalf("Bind(%s) = %v", k, bound)
		}
		cands = append(cands, selection.Candidate{Slot: s, Usable: true})
	}
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // three full blocks, a holds two
	ra, _ := p.Index().Lookup("a")
	rb, _ := p.Index().Lookup("b")
	p.Index().Apply(ra, batchOf(storedEv(0, false, 4, toks[:8], 11, 12)))
	p.Index().Apply(rb, batchOf(storedEv(0, false, 4, []uint32{0, 0, 0, 0}, 21)))

	f := rt.Extractor().NewFeatures()
	f.PromptBytes = 100
	s := selection.NewScratch(3)

	// No token ids (the preflight failed): the estimate alone, no prediction.
	d, res := rt.Route(f, cands, s, p, nil)
	res.Release()
	if d.Precise || cands[0].Precise || p.Index().Predicted() != 0 {
		t.Fatalf("without tokens: %+v, predicted %d", d, p.Index().Predicted())
	}
	s.Tokens = toks
	d, res = rt.Route(f, cands, s, p, nil)
	res.Release()
	if !d.Precise || !cands[0].Precise || cands[0].Overlap != 8 || !cands[1].Precise || cands[1].Overlap != 0 || cands[2].Precise {
		t.Fatalf("with tokens: %+v, candidates %+v", d, cands)
	}
	if d.Slot != cands[0].Slot || p.Index().Predicted() == 0 {
		t.Fatalf("decision %+v, predicted %d: want replica a, its blocks predicted", d, p.Index().Predicted())
	}
	if pr, ap := p.Decisions(); pr != 1 || ap != 1 {
		t.Fatalf("decisions precise %d approximate %d, want 1 and 1", pr, ap)
	}
	var storage selection.Reservation
	allocs := testing.AllocsPerRun(100, func() {
		_, r := rt.Route(f, cands, s, p, &storage)
		r.Release()
	})
	if allocs != 0 {
		t.Fatalf("Route with the precise annotator allocates %v times", allocs)
	}
}

// TestPreciseEstimateCap checks the estimate cap (SetEstimate): a
// candidate whose exact overlap exceeds what the router's estimate credits
// it with, on blocks this router routed there, is left to the estimate
// (Precise cleared); one holding such blocks from traffic the router did
// not route keeps its exact overlap, and so does one whose exact overlap
// is the lower; ExactPastEstimate or no estimate keeps every exact overlap;
// a candidate the estimate credits with the whole fingerprint of a longer
// prompt keeps its exact overlap; CapForeign leaves the foreign one to the
// estimate too; and Route still does not allocate.
func TestPreciseEstimateCap(t *testing.T) {
	now := time.Unix(100, 0)
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // three full blocks
	for _, mode := range []string{"cap", "exact", "none", "all"} {
		t.Run(mode, func(t *testing.T) {
			p, err := NewPrecise(PreciseConfig{
				Index:             Config{BlockSize: 4, Now: func() time.Time { return now }},
				Engines:           []PreciseEngine{{Feed: Endpoint{Replica: "a"}}, {Feed: Endpoint{Replica: "b"}}, {Feed: Endpoint{Replica: "c"}}},
				ExactPastEstimate: mode == "exact",
				CapForeign:        mode == "all",
			})
			if err != nil {
				t.Fatal(err)
			}
			rt, err := selection.NewRouter(selection.Config{BlockTokens: 4, PrefixTokens: 64})
			if err != nil {
				t.Fatal(err)
			}
			if mode != "none" {
				p.SetEstimate(rt)
			}
			var cands []selection.Candidate
			for _, k := range []string{"a", "b", "c"} {
				s, _ := rt.Register(k)
				p.Bind(s, k)
				cands = append(cands, selection.Candidate{Slot: s, Usable: true})
			}
			x := p.Index()
			ra, _ := x.Lookup("a")
			rb, _ := x.Lookup("b")
			rc, _ := x.Lookup("c")
			keys := x.Keys(nil, 0, toks)
			// a holds two blocks this router routed there (predicted, then
			// stored) and its estimate no longer credits; c holds two blocks
			// from traffic the router never saw; b holds one, and the
			// estimate believes it holds all three.
			x.Hold(ra, keys[:2], time.Minute)
			x.Apply(ra, batchOf(storedEv(0, false, 4, toks[:8], 11, 12)))
			x.Apply(rc, batchOf(storedEv(0, false, 4, toks[:8], 31, 32)))
			x.Apply(rb, batchOf(storedEv(0, false, 4, toks[:4], 21)))
			x.Release(ra, keys[:2], 0)
			if !x.Own(ra, keys[0]) || !x.Own(ra, keys[1]) || x.Own(rc, keys[0]) || x.Own(rb, keys[0]) {
				t.Fatalf("own: a %v %v, c %v, b %v; want a's only", x.Own(ra, keys[0]), x.Own(ra, keys[1]), x.Own(rc, keys[0]), x.Own(rb, keys[0]))
			}
			f := promptOf(rt, toks)
			rt.Learn(f, cands[1].Slot)
			s := selection.NewScratch(3)
			s.Tokens = toks
			if !p.Annotate(f, cands, s) {
				t.Fatal("no precise candidate")
			}
			if !cands[1].Precise || cands[1].Overlap != 4 {
				t.Errorf("b (exact below the estimate): %+v, want the exact 4", cands[1])
			}
			capped := mode == "cap" || mode == "all"
			if cands[2].Precise == (mode == "all") {
				t.Errorf("c (blocks from traffic the router did not route): %+v, want precise %v", cands[2], mode != "all")
			}
			if cands[0].Precise == capped {
				t.Errorf("a (exact past the estimate on its own blocks): precise %v, want %v", cands[0].Precise, !capped)
			}
			d := rt.Pick(f, cands, s)
			wantA := 8
			if capped {
				wantA = 0
			}
			wantC := 8
			if mode == "all" {
				wantC = 0
			}
			if s.Overlap[0] != wantA || s.Overlap[1] != 4 || s.Overlap[2] != wantC {
				t.Errorf("Pick's overlaps %v, want a %d, b 4, c %d (decision %+v)", s.Overlap[:3], wantA, wantC, d)
			}

			// The estimate holds a's whole fingerprint (one block, the
			// prompt truncated): the exact overlap stands.
			g := rt.Extractor().NewFeatures()
			g.Blocks = selection.AppendTokenBlocks(g.Blocks[:0], 0, toks[:4], 4)
			g.Truncated = true
			g.PromptBytes = len(toks) * 4
			rt.Learn(g, cands[0].Slot)
			p.Annotate(g, cands, s)
			if !cands[0].Precise || cands[0].Overlap != 8 {
				t.Errorf("truncated prompt, estimate holds its whole fingerprint: a %+v, want the exact 8", cands[0])
			}

			// Routing a request with held keys marks them too.
			for i := range cands {
				cands[i].Precise = false
			}
			x.Hold(rc, keys[:1], time.Minute)
			if !x.Own(rc, keys[0]) || x.Own(rc, keys[1]) {
				t.Errorf("after a hold of c's first block: own %v %v, want true false", x.Own(rc, keys[0]), x.Own(rc, keys[1]))
			}
			x.Release(rc, keys[:1], 0)

			var storage selection.Reservation
			if allocs := testing.AllocsPerRun(100, func() {
				_, r := rt.Route(f, cands, s, p, &storage)
				r.Release()
			}); allocs != 0 {
				t.Errorf("Route with the estimate cap allocates %v times", allocs)
			}
		})
	}
}
