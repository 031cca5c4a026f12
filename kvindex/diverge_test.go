package kvindex

import (
	"strconv"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestWaitRule: a request without a cached message prefix is routed at
// once, its preflight a Late handle whose tokens come later, unless an
// engine dropped indexed blocks within RemovalWindow, the router saw other
// instances, or there is no estimate cap: then it waits, as before.
func TestWaitRule(t *testing.T) {
	srv := newChatTokenizer(t, false)
	p, preflight := prefixPrecise(t, srv)
	if !p.WaitPreflight() {
		t.Fatal("no estimate cap: want a wait")
	}
	rt, err := selection.NewRouter(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p.SetEstimate(rt)
	if p.WaitPreflight() {
		t.Fatal("a lone instance, nothing evicted: want no wait")
	}

	gate := make(chan struct{})
	srv.gate.Store(&gate)
	toks, late, err := preflight(time.Minute, "a prompt of its own, one message")
	if toks != nil || late == nil || err != nil {
		t.Fatalf("no wait: tokens %v, late %v, err %v; want a Late handle at once", toks, late, err)
	}
	if !p.Bind(0, "a") {
		t.Fatal("bind a")
	}
	late.Routed(0)
	close(gate)
	eventually(t, "the late tokens predicted", func() bool { return p.LateOutcomes(LatePredicted) == 1 })
	late.End()
	if _, _, unwaited := p.DivergeStats(); unwaited != 1 {
		t.Errorf("unwaited %d, want 1", unwaited)
	}
	if waited, _ := p.Waited(); waited != 0 {
		t.Errorf("waited %d, want 0", waited)
	}

	// The engine evicts one of its indexed blocks: requests wait for the
	// window.
	now := time.Now()
	p.x.cfg.Now = func() time.Time { return now }
	ra, _ := p.Index().Lookup("a")
	p.Index().Apply(ra, batchOf(Event{Kind: KindBlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU"}))
	if !p.WaitPreflight() {
		t.Fatal("a block evicted just now: want a wait")
	}
	if _, late, err := preflight(time.Minute, "another prompt"); late != nil || err != nil {
		t.Fatalf("after an eviction: late %v, err %v; want the tokens", late, err)
	}
	now = now.Add(RemovalWindow)
	if p.WaitPreflight() {
		t.Fatal("RemovalWindow after the eviction: want no wait")
	}

	rt.SetExternalLoad(0, 1, 0, 0) // load this instance did not route: another instance
	if !p.WaitPreflight() {
		t.Fatal("other instances seen: want a wait")
	}
	p.SetEstimate(nil)
	if !p.WaitPreflight() {
		t.Fatal("no estimate cap: want a wait")
	}
}

// TestDiverged: a precise decision diverges from the estimate when a kept
// exact overlap is more than one router block below the estimate's credit
// (the engine evicted it) or above it in blocks this router did not route,
// not when the two agree.
func TestDiverged(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} // three full blocks
	for _, c := range []struct {
		name     string
		stored   int // blocks a's engine stored of the prompt
		routed   bool
		diverged bool
	}{
		{"agree", 3, true, false},
		{"evicted", 1, true, true},
		{"foreign", 3, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, rt, slots := estimatedOn(t, PreciseConfig{Index: Config{BlockSize: 4, Now: func() time.Time { return time.Unix(100, 0) }}}, 1, "a")
			s0 := slots[0]
			x := p.Index()
			ra, _ := x.Lookup("a")
			f := promptOf(rt, toks)
			keys := x.Keys(nil, 0, toks)
			if c.routed {
				rt.Learn(f, s0)
				x.Hold(ra, keys, time.Minute)
			}
			x.Apply(ra, batchOf(storedEv(0, false, 4, toks[:4*c.stored], []uint64{11, 12, 13}[:c.stored]...)))
			if c.routed {
				x.Release(ra, keys, 0)
			}
			cands := []selection.Candidate{{Slot: s0, Usable: true}}
			s := selection.NewScratch(1)
			s.Tokens = toks
			if !p.Annotate(f, cands, s) {
				t.Fatal("no precise candidate")
			}
			seen, diverged, _ := p.DivergeStats()
			if seen != 1 || (diverged == 1) != c.diverged {
				t.Errorf("recorded %d, diverged %d; want 1 recorded, diverged %v (candidate %+v)", seen, diverged, c.diverged, cands[0])
			}
		})
	}
}

// TestWaitRulePrefix: a chat routed on its cached message prefix is routed
// by the estimate, without the prefix's tokens, when the wait rule would not
// wait (the exact overlaps would decide as the estimate); its Late handle
// still counts the prefix's tokens in the prompt's (PromptTokens) and its
// deferred preflight still teaches the cache.
func TestWaitRulePrefix(t *testing.T) {
	srv := newChatTokenizer(t, false)
	p, preflight := prefixPrecise(t, srv)
	sys := "a shared system prompt, several blocks long"
	if _, late, err := preflight(time.Minute, sys, "q0"); err != nil || late != nil {
		t.Fatalf("first preflight: late %v, err %v", late, err)
	}
	eventually(t, "system prompt tokenized", func() bool { n, _ := p.Tokenizer().CacheLen(); return n == 3 })
	for i := 1; i <= prefixTrustChecks; i++ {
		if _, late, err := preflight(time.Minute, sys, "q"+strconv.Itoa(i)); err != nil || late != nil {
			t.Fatalf("question %d: late %v, err %v", i, late, err)
		}
	}
	rt, err := selection.NewRouter(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p.SetEstimate(rt)
	prefix, _ := chatTokens(chatBody(sys, "q1"))
	prefix = append(prefix, 1, 'a')
	body := chatBody(sys, "q1", "r1", "q1b")
	toks, late, err := preflight(time.Minute, sys, "q1", "r1", "q1b")
	if toks != nil || late == nil || err != nil {
		t.Fatalf("next turn: tokens %v, late %v, err %v; want a Late handle and no tokens", toks, late, err)
	}
	if got := late.PromptTokens(0, 1); got <= len(prefix) || got >= len(prefix)+len(body) {
		t.Errorf("PromptTokens(0, 1) = %d, want the prefix's %d plus the other messages' bytes", got, len(prefix))
	}
	before, _ := p.Tokenizer().CacheLen()
	late.End() // sends the deferred preflight: the cache learns the turn
	eventually(t, "the turn's messages learned", func() bool { n, _ := p.Tokenizer().CacheLen(); return n > before })
	if _, _, unwaited := p.DivergeStats(); unwaited != 1 {
		t.Errorf("unwaited %d, want 1", unwaited)
	}
}

// TestWaitRuleSeesOthersWithoutWaiting: the wait rule's evidence of other
// instances needs no waiting decision. A lone instance that routes every
// request at once (the reservations' prefill is the prompt bytes'
// estimate: no tokens) and whose engines store up to 15% more tokens than
// that estimate (a chat template's) keeps routing at once; once another
// instance's requests store runs on the same engines (no reservation of
// this instance's explains them), the others' prefill estimate sees it
// within the other's first few requests, whatever this instance's
// history alone (EvidenceWindow): here 8 requests, 11 s, where the share
// since ever (250 s alone, rho 0.15 of its own runs misread) would take
// 34; then every request waits.
func TestWaitRuleSeesOthersWithoutWaiting(t *testing.T) {
	const bs = 16
	now := time.Unix(1000, 0)
	p, err := NewPrecise(PreciseConfig{
		Index:    Config{BlockSize: bs, Now: func() time.Time { return now }},
		Engines:  []PreciseEngine{{Feed: Endpoint{Replica: "a"}}, {Feed: Endpoint{Replica: "b"}}},
		WaitAuto: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := selection.NewRouter(selection.Config{BlockTokens: bs})
	if err != nil {
		t.Fatal(err)
	}
	p.SetEstimate(rt)
	var cands []selection.Candidate
	var reps []Replica
	for _, key := range []string{"a", "b"} {
		s, err := rt.Register(key)
		if err != nil {
			t.Fatal(err)
		}
		p.Bind(s, key)
		r, _ := p.Index().Lookup(key)
		cands, reps = append(cands, selection.Candidate{Slot: s, Usable: true}), append(reps, r)
	}
	fp := selection.NewForeignPrefill()
	fp.SetRouter(rt)
	p.OnStored(fp.StoredRun)
	next := uint32(1)
	prompt := func(blocks int) []uint32 {
		toks := make([]uint32, blocks*bs)
		for i := range toks {
			toks[i] = next
			next++
		}
		return toks
	}
	// store has replica r's engine compute toks in chunks of 8 blocks.
	store := func(r Replica, toks []uint32) {
		var parent uint64
		for i := 0; i < len(toks); i += 8 * bs {
			chunk := toks[i:min(i+8*bs, len(toks))]
			var hashes []uint64
			for j := 0; j < len(chunk); j += bs {
				hashes = append(hashes, uint64(chunk[j])<<8|1)
			}
			p.Index().Apply(r, batchOf(storedEv(parent, parent != 0, bs, chunk, hashes...)))
			parent = hashes[len(hashes)-1]
			now = now.Add(20 * time.Millisecond)
		}
	}
	s := selection.NewScratch(len(cands))
	// own routes one request of blocks blocks at once, as the module does
	// under the rule (Reserved with no tokens), and its engine stores
	// extra blocks more than the bytes' estimate.
	own := func(blocks, extra int) {
		fp.Refresh(now)
		toks := prompt(blocks)
		f := rt.Extractor().NewFeatures()
		f.Blocks = selection.AppendTokenBlocks(f.Blocks[:0], 0, toks, bs)
		f.PromptBytes = len(toks) * int(selection.DefaultCharsPerToken)
		d, res := rt.Route(f, cands, s, nil, nil)
		if res == nil {
			t.Fatal("no reservation")
		}
		fp.Reserved(res, 0)
		store(reps[d.Index], append(toks, prompt(extra)...))
		res.PrefillDone()
		fp.FirstToken(cands[d.Index].Slot, now)
		now = now.Add(50 * time.Millisecond)
		res.Release()
		now = now.Add(time.Second)
	}
	for i := range 200 {
		own(64+8*(i%5), (64+8*(i%5))*15/100)
	}
	fp.Refresh(now)
	if p.WaitPreflight() {
		t.Fatalf("a lone instance whose engines stored 15%% past its estimate reads as several (rho %.3f): want no wait", fp.Share())
	}
	if tok, _ := fp.Counted(); tok == 0 {
		t.Fatal("no own run past the estimate read as foreign: the test's premise")
	}
	// Another instance starts: its requests' runs, interleaved with this
	// instance's own.
	seen := -1
	for i := range 40 {
		store(reps[i%2], prompt(64))
		own(64, 0)
		if fp.Refresh(now.Add(time.Millisecond)); p.WaitPreflight() {
			seen = i + 1
			break
		}
	}
	if seen < 0 || seen > 10 {
		t.Fatalf("the other instance seen after %d of its requests (rho %.3f since ever): want within 10", seen, fp.Share())
	}
	t.Logf("the other instance seen after %d of its requests, rho %.3f", seen, fp.Share())
}

// TestLateCredit: a request the wait rule routes at once reserves the
// bytes' estimate of its prompt (no tokens yet), and its engine stores
// all its tokens, a chat template's among them; once its late tokens
// come, the tokens past that estimate are credited as this instance's own
// (ForeignPrefill.Credit), so its stored run does not read as another
// instance's prefill.
func TestLateCredit(t *testing.T) {
	srv := newChatTokenizer(t, false)
	p, preflight := prefixPrecise(t, srv)
	rt, err := selection.NewRouter(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p.SetEstimate(rt)
	fp := selection.NewForeignPrefill()
	fp.SetRouter(rt)
	p.SetForeign(fp)
	s0, err := rt.Register("a")
	if err != nil {
		t.Fatal(err)
	}
	p.Bind(s0, "a")
	now := time.Unix(100, 0)
	for i, credit := range []bool{false, true} {
		gate := make(chan struct{})
		srv.gate.Store(&gate)
		_, late, err := preflight(time.Minute, "a prompt of its own, one message, long enough "+strconv.Itoa(i))
		if late == nil || err != nil {
			t.Fatalf("late %v, err %v: want a Late handle at once", late, err)
		}
		est := late.estimate
		fp.Routed(s0, est) // Reserved with no tokens: the bytes' estimate
		if credit {
			late.Routed(s0)
		}
		close(gate)
		eventually(t, "the late tokens", func() bool { late.mu.Lock(); defer late.mu.Unlock(); return late.done })
		n := len(late.tokens)
		if est <= 0 || n <= est+4 {
			t.Fatalf("estimate %d, tokens %d: the test's premise is a template past the bytes' estimate", est, n)
		}
		before, _ := fp.Counted()
		fp.Stored(s0, n, 1, 1, now) // the engine stores them all
		after, _ := fp.Counted()
		late.End()
		if foreign := after - before; credit && foreign != 0 || !credit && foreign != uint64(n-est) {
			t.Errorf("credited %v: %d of %d stored tokens read as foreign (estimate %d)", credit, foreign, n, est)
		}
	}
}
