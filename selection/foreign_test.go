package selection

import (
	"testing"
	"time"
)

func TestForeignPrefill(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const bt = 16
	tests := []struct {
		name string
		run  func(f *ForeignPrefill) int64 // returns Pending at the end
		want int64
	}{
		{"a foreign run counts", func(f *ForeignPrefill) int64 {
			f.Stored(0, 8, bt, 0, at(0))
			return f.Pending(0, at(0))
		}, 128},
		{"decode-sized runs do not", func(f *ForeignPrefill) int64 {
			f.Stored(0, 1, bt, 0, at(0))
			f.Stored(0, 3, bt, 0, at(1))
			return f.Pending(0, at(1))
		}, 0},
		{"own credit absorbs own blocks", func(f *ForeignPrefill) int64 {
			f.Routed(0, 100)
			f.Stored(0, 8, bt, 100, at(0)) // 128 stored: 100 own, 28 foreign
			return f.Pending(0, at(0))
		}, 28},
		{"credit dropped once nothing of ours is pending", func(f *ForeignPrefill) int64 {
			f.Routed(0, 1000)
			f.FirstToken(0, at(0))
			f.Stored(0, 8, bt, 0, at(50)) // within grace: ours
			f.Stored(0, 8, bt, 0, at(500))
			return f.Pending(0, at(500))
		}, 128},
		{"decays with tau", func(f *ForeignPrefill) int64 {
			f.Stored(0, 64, bt, 0, at(0)) // 1024
			return f.Pending(0, at(1000))
		}, 377}, // 1024 / e
		{"slots are separate; reset drops", func(f *ForeignPrefill) int64 {
			f.Stored(1, 8, bt, 0, at(0))
			f.Stored(0, 8, bt, 0, at(0))
			f.Reset(0)
			return f.Pending(0, at(0)) + 1000*f.Pending(1, at(0))
		}, 128000},
		{"out of range slots are ignored", func(f *ForeignPrefill) int64 {
			f.Stored(-1, 8, bt, 0, at(0))
			f.Stored(MaxReplicas, 8, bt, 0, at(0))
			f.Routed(-1, 5)
			return f.Pending(-1, at(0)) + f.Pending(MaxReplicas, at(0))
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.run(NewForeignPrefill()); got != tt.want {
				t.Fatalf("pending = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestForeignPrefillApply(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
	f := NewForeignPrefill()
	now := time.Unix(5, 0)
	f.Stored(cands[0].Slot, 10, 16, 0, now)
	f.Apply(rt, cands[0].Slot, now)
	if got := rt.ExternalPrefill(cands[0].Slot); got != 160 {
		t.Fatalf("applied %d, want 160", got)
	}
}

// The lifecycle the module and the fleet simulation share: StoredRun from
// the feeds reads this instance's pending prefill from the router and
// hands it the estimate at once; Reserved credits a reservation; Refresh
// decays the estimates on the router (at most once per RefreshEvery) and
// leaves a decayed slot at 0.
func TestForeignPrefillLifecycle(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
	a, b := cands[0].Slot, cands[1].Slot
	f := NewForeignPrefill()
	t0 := time.Unix(100, 0)
	f.StoredRun(a, 10, 16, t0) // no router yet: nothing
	if got, _ := f.Counted(); got != 0 {
		t.Fatalf("counted %d without a router", got)
	}
	f.SetRouter(rt)

	res := rt.Reserve(a, 100) // ours: 100 tokens pending on a
	f.Reserved(res, 0)
	f.Reserved(nil, 0)
	f.StoredRun(a, 10, 16, t0) // 160 stored: 100 ours, 60 foreign
	f.StoredRun(b, 64, 16, t0) // 1024 foreign
	f.StoredRun(b, 1, 16, t0)  // a decode step: not prefill
	if got := rt.ExternalPrefill(a); got != 60 {
		t.Errorf("a: external prefill %d, want 60", got)
	}
	if got := rt.ExternalPrefill(b); got != 1024 {
		t.Errorf("b: external prefill %d, want 1024", got)
	}
	if tok, runs := f.Counted(); tok != 1084 || runs != 2 {
		t.Errorf("counted %d tokens in %d runs, want 1084 in 2", tok, runs)
	}

	f.Refresh(t0.Add(time.Second)) // e^-1
	if got := rt.ExternalPrefill(b); got != 377 {
		t.Errorf("b after one tau: %d, want 377", got)
	}
	f.Refresh(t0.Add(time.Second + time.Millisecond)) // within RefreshEvery: unchanged
	if got := rt.ExternalPrefill(b); got != 377 {
		t.Errorf("b refreshed again within RefreshEvery: %d, want 377", got)
	}
	f.Refresh(t0.Add(30 * time.Second))
	if ga, gb := rt.ExternalPrefill(a), rt.ExternalPrefill(b); ga != 0 || gb != 0 {
		t.Errorf("after 30 tau: a %d, b %d, want 0", ga, gb)
	}
	if f.active != (SlotSet{}) {
		t.Errorf("decayed slots still refreshed: %v", f.active)
	}
	res.Release()

	f.StoredRun(b, 64, 16, t0.Add(30*time.Second))
	f.Detach()
	if got := rt.ExternalPrefill(b); got != 0 {
		t.Errorf("detached: b still %d", got)
	}
	f.StoredRun(b, 64, 16, t0.Add(30*time.Second))
	if got := rt.ExternalPrefill(b); got != 0 {
		t.Errorf("detached, then a run: b %d", got)
	}

	rt2, c2 := newTestRouter(t, Config{BlockTokens: 16}, 1)
	f.SetRouter(rt2)
	f.StoredRun(c2[0].Slot, 8, 16, t0.Add(31*time.Second))
	if allocs := testing.AllocsPerRun(100, func() { f.Refresh(time.Now()) }); allocs != 0 {
		t.Errorf("Refresh allocates %.1f times", allocs)
	}
}

// The decay follows the engines' prefill speed: the time for TauTokens
// prompt tokens at a low quantile of this instance's own first tokens per
// prefill token (queued requests count little), Tau until learned or with
// TauTokens 0, bounded by TauRange; prefills too small to time are
// ignored.
func TestForeignPrefillDecayLearned(t *testing.T) {
	feed := func(f *ForeignPrefill, n int, prefill int64, perTok time.Duration) {
		for range n {
			f.FirstTokenAfter(0, time.Unix(1, 0), prefill, time.Duration(prefill)*perTok)
		}
	}
	near := func(got, want time.Duration) bool { return got > want*95/100 && got < want*105/100 }

	f := NewForeignPrefill()
	if got := f.Decay(); got != DefaultForeignTau {
		t.Fatalf("decay before learning %v, want Tau %v", got, DefaultForeignTau)
	}
	feed(f, 50, 500, time.Millisecond) // too small to time
	if got := f.Decay(); got != DefaultForeignTau {
		t.Fatalf("decay after small prefills %v, want Tau", got)
	}
	feed(f, 200, 4096, 250*time.Microsecond)
	slow := f.Decay()
	if want := DefaultForeignTauTokens * 250 * time.Microsecond; !near(slow, want) {
		t.Fatalf("decay at 250µs per token %v, want about %v", slow, want)
	}
	// The same engines four times faster (the benchmark's time-scaled
	// simulators): the decay follows within a few hundred first tokens.
	feed(f, 300, 4096, 62500*time.Nanosecond)
	if fast := f.Decay(); !near(fast*4, slow) {
		t.Fatalf("decay after 4x faster engines %v, want about %v", fast, slow/4)
	}
	// Half the first tokens queued 4x as long: the low quantile stays
	// with the engines' own speed.
	for range 300 {
		feed(f, 1, 4096, 62500*time.Nanosecond)
		feed(f, 1, 4096, 250*time.Microsecond)
	}
	if got := f.Decay(); !near(got*4, slow) {
		t.Fatalf("decay with half the requests queued %v, want about %v", got, slow/4)
	}
	// The estimate decays with the learned time constant.
	t0 := time.Unix(100, 0)
	f.Stored(3, 64, 16, 0, t0) // 1024 tokens
	if got := f.Pending(3, t0.Add(f.Decay())); got < 370 || got > 384 {
		t.Fatalf("pending after one learned decay %d, want about 1024/e", got)
	}

	fixed := NewForeignPrefill()
	fixed.TauTokens = 0
	feed(fixed, 100, 4096, 62500*time.Nanosecond)
	if got := fixed.Decay(); got != DefaultForeignTau {
		t.Fatalf("decay with TauTokens 0 %v, want Tau", got)
	}
	bounded := NewForeignPrefill()
	feed(bounded, 10, 4096, time.Second)
	if got := bounded.Decay(); got != DefaultForeignTau*TauRange {
		t.Fatalf("decay for absurdly slow engines %v, want the bound %v", got, DefaultForeignTau*TauRange)
	}
}

// The others' stored runs as their resident contexts (ResidentLives):
// nothing until a request of this instance has ended, then decaying with
// the learned mean life times ResidentLives, counted in load(r)'s context
// terms through the router for a prefix warm somewhere, and the larger of
// it and the engine-reported KV tokens (the same contexts) counts.
func TestForeignResidentContexts(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, ContextWeight: 1}, 1)
	s := cands[0].Slot
	t0 := time.Unix(100, 0)
	f := NewForeignPrefill()
	f.SetRouter(rt)
	f.ResidentLives = 2
	f.StoredRun(s, 64, 16, t0) // 1024 tokens, before any life is known
	if _, ctx := f.Estimate(s, t0); ctx != 0 || f.ResidentDecay(t0) != 0 {
		t.Fatalf("context %d, decay %v before a request ended; want none", ctx, f.ResidentDecay(t0))
	}
	// From the first Refresh on, before any request ended, the oldest
	// request's age is the life's lower bound; ResidentLife replaces it.
	g := NewForeignPrefill()
	g.ResidentLives = 2
	g.SetRouter(rt)
	g.Refresh(t0)
	if got := g.ResidentDecay(t0.Add(3 * time.Second)); got != 6*time.Second {
		t.Fatalf("resident decay 3 s after the first request %v, want 2 x 3 s", got)
	}
	g.ResidentLife = 5 * time.Second
	if got := g.ResidentDecay(t0.Add(3 * time.Second)); got != 10*time.Second {
		t.Fatalf("resident decay with ResidentLife 5 s %v, want 2 x 5 s", got)
	}
	f.Lived(0) // ignored
	f.Lived(4 * time.Second)
	for range 200 {
		f.Lived(6 * time.Second)
	}
	if got := f.ResidentDecay(t0); got < 11900*time.Millisecond || got > 12*time.Second {
		t.Fatalf("resident decay %v, want about 2 lives of 6 s", got)
	}
	sc := NewScratch(1)
	feat := features(rt.Config(), blocksOf(1, 8), 100)
	loadOf := func() float64 { rt.Pick(feat, cands, sc); return sc.Load[0] - float64(rt.ExternalPrefill(s)) }
	base := loadOf()
	f.StoredRun(s, 64, 16, t0)
	if got := rt.ExternalContext(s); got != 1024 {
		t.Fatalf("context on the router %d, want the run's 1024 tokens", got)
	}
	if got := loadOf(); got != base {
		t.Fatalf("load for a prefix cold everywhere %v, want %v: rendezvous placement, the others' contexts left out", got, base)
	}
	rt.Learn(feat, s) // the prefix warm there: they count
	if got := loadOf(); got <= base {
		t.Fatalf("load with the others' contexts %v, want above the idle %v", got, base)
	}
	f.Refresh(t0.Add(12 * time.Second)) // one decay: 1024/e
	if got := rt.ExternalContext(s); got < 370 || got > 384 {
		t.Fatalf("context after one resident decay %d, want about 1024/e", got)
	}
	withCtx := loadOf()
	rt.SetExternalLoad(s, 0, 0, 100) // engine-reported KV below the estimate: the estimate counts
	if got := loadOf(); got != withCtx {
		t.Fatalf("load with a smaller engine KV figure %v, want %v", got, withCtx)
	}
	rt.SetExternalLoad(s, 0, 0, 5000) // above it: the engine's figure counts
	if got := loadOf(); got <= withCtx {
		t.Fatalf("load with a larger engine KV figure %v, want above %v", got, withCtx)
	}
	f.Refresh(t0.Add(10 * time.Minute))
	if got := rt.ExternalContext(s); got != 0 {
		t.Fatalf("context long after %d, want 0", got)
	}
	f.StoredRun(s, 64, 16, t0.Add(10*time.Minute))
	f.Detach()
	if got := rt.ExternalContext(s); got != 0 {
		t.Fatalf("context after Detach %d, want 0", got)
	}
}

// The others' unseen load (SetPrior): rho (foreign over own stored
// tokens) times this instance's pending prefill on a replica counts as the
// others' prefill there, the larger of it and the stored-run estimate;
// nothing while alone (no foreign tokens), while off, or once this
// instance's own load there is gone.
func TestForeignPrefillPrior(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 512}, 3)
	a, b, c := cands[0].Slot, cands[1].Slot, cands[2].Slot
	f := NewForeignPrefill()
	f.SetRouter(rt)
	f.SetPrior(1)
	t0 := time.Unix(100, 0)

	res := rt.Reserve(a, 1024)
	f.Reserved(res, 0) // alone so far: rho 0
	if got := rt.ExternalPrefill(a); got != 0 {
		t.Fatalf("alone: external prefill %d on a, want 0", got)
	}
	f.StoredRun(a, 64, 16, t0) // our 1024 tokens stored
	res.Release()
	f.StoredRun(b, 192, 16, t0) // 3072 foreign tokens: rho 3
	if got := rt.ExternalPrefill(b); got != 3072 {
		t.Fatalf("b: external prefill %d, want the stored 3072", got)
	}

	res = rt.Reserve(c, 1000) // 1000 pending on c
	f.Reserved(res, 0)
	if got, want := rt.ExternalPrefill(c), int64(3*1000); got != want {
		t.Errorf("c with our request: external prefill %d, want rho x our pending %d", got, want)
	}
	f.Refresh(t0.Add(10 * time.Millisecond))
	if got, want := rt.ExternalPrefill(c), int64(3*1000); got != want {
		t.Errorf("c refreshed: %d, want %d", got, want)
	}
	res.Release()
	f.Refresh(t0.Add(20 * time.Millisecond))
	if got := rt.ExternalPrefill(c); got != 0 {
		t.Errorf("c once our request ended: %d, want 0", got)
	}

	// A fresh engine scrape of c (engine_metrics) counts the others'
	// queue there already: no prior on c while it is fresh, the prior
	// again once it is stale.
	rt.SetExternalFresh(c, true)
	res = rt.Reserve(c, 1000)
	f.Reserved(res, 0)
	f.Refresh(t0.Add(22 * time.Millisecond))
	if got := rt.ExternalPrefill(c); got != 0 {
		t.Errorf("c with a fresh scrape: external prefill %d, want 0", got)
	}
	rt.SetExternalFresh(c, false)
	f.Reserved(res, 0)
	f.Refresh(t0.Add(24 * time.Millisecond))
	if got, want := rt.ExternalPrefill(c), int64(3*1000); got != want {
		t.Errorf("c once the scrape is stale: external prefill %d, want %d", got, want)
	}
	res.Release()
	f.Refresh(t0.Add(26 * time.Millisecond))

	f.SetPrior(0)
	res = rt.Reserve(c, 1000)
	f.Reserved(res, 0)
	f.Refresh(t0.Add(30 * time.Millisecond))
	if got := rt.ExternalPrefill(c); got != 0 {
		t.Errorf("prior off: c %d, want 0", got)
	}
	res.Release()
}

// Reserved credits a request with its prompt's exact token count when the
// preflight gave one: the reservation's prefill estimates the prompt from
// its bytes (chars_per_token), and an engine that makes more tokens of
// them stores more than that, which must not read as another instance's
// prefill (own10: 4-6 of 20 own requests did through a real Caddy).
func TestForeignPrefillExactCredit(t *testing.T) {
	for _, tt := range []struct {
		name        string
		tokens      int
		wantForeign uint64
	}{
		{"the bytes' estimate: 400 tokens credited, 432 stored", 0, 32},
		{"the exact count: 440 credited", 440, 0},
		{"an exact count below the estimate: 380 credited", 380, 52},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
			f := NewForeignPrefill()
			f.SetRouter(rt)
			// 25 blocks' worth of bytes: 400 tokens by the estimate.
			_, res := rt.Route(features(rt.Config(), make([]uint64, 25), 0), cands, NewScratch(1), nil, nil)
			if res.Prefill() != 400 {
				t.Fatalf("reserved prefill %d, want the estimate's 400", res.Prefill())
			}
			f.Reserved(res, tt.tokens)
			f.StoredRun(cands[0].Slot, 27, 16, time.Unix(100, 0)) // the engine's 432 whole-block tokens
			if got, _ := f.Counted(); got != tt.wantForeign {
				t.Errorf("foreign %d tokens, want %d", got, tt.wantForeign)
			}
			res.Release()
		})
	}
}

// TestForeignPrefillEstimateUnits: a request routed by the estimate onto a
// replica the estimate credits with an overlap, whose prompt has fewer
// tokens than its bytes' estimate (prose lighter than chars_per_token), is
// credited its estimated prefill in the prompt's tokens: the engine holds
// the overlap in those tokens too, and stores the rest. The shift (the
// estimate's prefill less the difference) credited less than that and read
// the rest as foreign. A precise reservation's overlap is in the prompt's
// tokens already: it keeps the shift; and a prompt with more tokens than
// its estimate keeps it too (the template's tokens, all still to compute).
func TestForeignPrefillEstimateUnits(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
	s := cands[0].Slot
	f := NewForeignPrefill()
	f.SetRouter(rt)
	blocks := make([]uint64, 25)
	for i := range blocks {
		blocks[i] = uint64(i) + 1
	}
	_, first := rt.Route(features(rt.Config(), blocks[:20], 0), cands, NewScratch(1), nil, nil)
	first.PrefillDone()
	first.Release()
	// 25 blocks' worth of bytes: 400 tokens by the estimate, 320 of them
	// held; the prompt has 360 tokens (0.9 of the estimate), the engine
	// holds 288 of them and stores 72.
	_, res := rt.Route(features(rt.Config(), blocks, 0), cands, NewScratch(1), nil, nil)
	if res.Prefill() != 80 || res.precise {
		t.Fatalf("reserved prefill %d (precise %v), want the estimate's 80", res.Prefill(), res.precise)
	}
	f.Reserved(res, 360)
	if res.Prefill() != 72 {
		t.Errorf("credited %d, want 72 (80 x 360/400); the shift's was 40", res.Prefill())
	}
	f.StoredRun(s, 4, 18, time.Unix(100, 0)) // the engine's 72
	if got, _ := f.Counted(); got != 0 {
		t.Errorf("foreign %d tokens, want 0", got)
	}
	res.PrefillDone()
	res.Release()

	// More tokens than the estimate: the shift (80 + 40), above the scale.
	other := append(blocks[:20:20], 101, 102, 103, 104, 105)
	_, res = rt.Route(features(rt.Config(), other, 0), cands, NewScratch(1), nil, nil)
	f.Reserved(res, 440)
	if res.Prefill() != 120 {
		t.Errorf("credited %d for 440 tokens, want the shift's 120", res.Prefill())
	}
	res.Release()

	// A precise reservation: the shift.
	pres := rt.Reserve(s, 80)
	pres.prompt, pres.precise = 400, true
	f.Reserved(pres, 360)
	if pres.Prefill() != 40 {
		t.Errorf("precise: credited %d, want the shift's 40", pres.Prefill())
	}
	pres.Release()
}

// A reservation whose estimate leaves nothing to prefill (the exact
// overlap covers the prompt's bytes' estimate: an agent's next turn) but
// whose preflight counts more tokens (the chat template's) reserves that
// count as pending prefill, which keeps its credit until its runs are
// stored, however long since the replica's last first token (through a
// real Caddy, TestE2EForeignOwnRuns/agent read such a turn as foreign
// whenever its runs came more than Grace after the previous turn's first
// token: under load).
func TestForeignPrefillCreditPending(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
	s := cands[0].Slot
	f := NewForeignPrefill()
	f.SetRouter(rt)
	t0 := time.Unix(100, 0)
	f.FirstToken(s, t0) // the previous turn's first token

	res := rt.Reserve(s, 0)
	res.prompt = 400 // the bytes' estimate, all of it overlapping
	f.Reserved(res, 448)
	if _, pend := rt.Load(s); pend != 48 || res.Prefill() != 48 {
		t.Fatalf("pending %d, reserved %d, want the preflight's 48", pend, res.Prefill())
	}
	f.StoredRun(s, 4, 16, t0.Add(time.Second)) // 64 stored, 48 ours, a second later
	if got, _ := f.Counted(); got != 16 {
		t.Errorf("foreign %d tokens, want 16", got)
	}
	res.PrefillDone()
	if _, pend := rt.Load(s); pend != 0 {
		t.Errorf("pending %d after the first token, want 0", pend)
	}
	res.Release()
	if _, pend := rt.Load(s); pend != 0 {
		t.Errorf("pending %d after the release, want 0", pend)
	}
}

// TestSetPrefillRacesRelease: the preflight's credit changes a reservation's
// pending prefill while its request's context may end on another goroutine
// (the sweeper's Release); whichever comes first, the slot's pending
// prefill returns to 0, never keeps the change or loses it twice. Under
// -race the form that read the reservation's prefill in Release fails here.
func TestSetPrefillRacesRelease(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
	s := cands[0].Slot
	for i := range 2000 {
		res := rt.Reserve(s, i%3*16) // 0 (the case that lost its credit), 16, 32
		done := make(chan struct{})
		go func() {
			res.Release()
			close(done)
		}()
		res.setPrefill(48)
		<-done
		if _, pend := rt.Load(s); pend != 0 {
			t.Fatalf("run %d: pending %d after the release, want 0", i, pend)
		}
	}
}

// ResidentWhole: a foreign stored run counts as the whole context it
// stands for, at this instance's own ratio of prompt to prefill tokens
// (a prompt of 1,000 tokens with 100 to prefill: 10); off, as its tokens;
// before any own prefill, as its tokens; the scale bounded.
func TestForeignResidentWhole(t *testing.T) {
	for _, tt := range []struct {
		name           string
		whole          bool
		prompt, prefix int // the own request's prompt tokens and the overlap its reservation leaves out
		max            float64
		want           int64
	}{
		{"off", false, 1000, 900, 0, 64},
		{"on, no own request", true, 0, 0, 0, 64},
		{"on, 1000 over 100", true, 1000, 900, 0, 640},
		{"on, nothing cached", true, 1000, 0, 0, 64},
		{"on, bounded", true, 100000, 99984, 0, 64 * MaxResidentWhole},
		{"on, bounded by ResidentWholeMax 3", true, 1000, 900, 3, 192},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt, cands := newTestRouter(t, Config{BlockTokens: 16, ContextWeight: 1}, 2)
			t0 := time.Unix(100, 0)
			f := NewForeignPrefill()
			f.ResidentLife = time.Second
			f.ResidentWhole, f.ResidentWholeMax = tt.whole, tt.max
			f.SetRouter(rt)
			if tt.prompt > 0 {
				res := rt.Reserve(cands[0].Slot, tt.prompt-tt.prefix)
				res.prompt = int32(tt.prompt) // the bytes' estimate, as Route sets it
				f.Reserved(res, 0)
				defer res.Release()
			}
			f.StoredRun(cands[1].Slot, 4, 16, t0) // 64 foreign tokens on the other replica
			if _, ctx := f.Estimate(cands[1].Slot, t0); ctx != tt.want {
				t.Errorf("context %d, want %d (scale %v)", ctx, tt.want, f.WholeScale())
			}
		})
	}
}

// ResidentEarly: the others' runs stored before this instance's first
// request count as contexts (off: none, TestForeignResidentContexts), kept
// whole until a life is known; the life's lower bound is the age of the
// first stored run, not of this instance's first Refresh.
func TestForeignResidentEarly(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, ContextWeight: 1}, 1)
	s := cands[0].Slot
	t0 := time.Unix(100, 0)
	f := NewForeignPrefill()
	f.ResidentEarly = true
	f.SetRouter(rt)
	f.StoredRun(s, 64, 16, t0) // 1024 tokens, the others' first agent
	if _, ctx := f.Estimate(s, t0); ctx != 1024 {
		t.Fatalf("context %d at the first run, want its 1024 tokens", ctx)
	}
	if got := rt.ExternalContext(s); got != 1024 {
		t.Fatalf("context on the router %d, want 1024", got)
	}
	f.StoredRun(s, 64, 16, t0.Add(time.Second))
	if got := f.ResidentDecay(t0.Add(time.Second)); got != 2*time.Second {
		t.Fatalf("resident decay 1 s after the first run %v, want 2 x 1 s", got)
	}
	// This instance's first request 4 s after the others' first run: the
	// decay is 2 x 4 s, and the runs are still counted.
	f.Refresh(t0.Add(4 * time.Second))
	if got := f.ResidentDecay(t0.Add(4 * time.Second)); got != 8*time.Second {
		t.Fatalf("resident decay at the first Refresh %v, want 2 x 4 s", got)
	}
	if got := rt.ExternalContext(s); got < 1000 {
		t.Fatalf("context at this instance's first request %d, want most of 2048", got)
	}
}

// TestForeignPrefillQueueCost: with QueueCost, each of this instance's
// requests before its first token on a replica (Router.Queued) adds
// QueueCost tokens to the prior's base (scaled by prior x rho like the
// pending prefill), a request reserving no prefill (an agent's next turn
// at its home) included; its first token or its end takes it out; alone
// (rho 0) nothing counts.
func TestForeignPrefillQueueCost(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 512}, 3)
	a, b, c := cands[0].Slot, cands[1].Slot, cands[2].Slot
	f := NewForeignPrefill()
	f.QueueCost = 4096
	f.SetRouter(rt)
	f.SetPrior(1)
	t0 := time.Unix(100, 0)

	res := rt.Reserve(a, 1024)
	f.Reserved(res, 0)
	if got := rt.ExternalPrefill(a); got != 0 {
		t.Fatalf("alone: external prefill %d on a, want 0", got)
	}
	f.StoredRun(a, 64, 16, t0) // our 1024 tokens stored
	res.PrefillDone()
	res.Release()
	f.StoredRun(b, 96, 16, t0) // 1536 foreign tokens: rho 1.5

	r1 := rt.Reserve(c, 0) // a next turn: no prefill reserved
	f.Reserved(r1, 0)
	if got, want := rt.ExternalPrefill(c), int64(1.5*4096); got != want {
		t.Errorf("one queued turn on c: external prefill %d, want rho x QueueCost %d", got, want)
	}
	r2 := rt.Reserve(c, 1000)
	f.Reserved(r2, 0)
	f.Refresh(t0.Add(10 * time.Millisecond))
	if got, want := rt.ExternalPrefill(c), int64(1.5*(2*4096+1000)); got != want {
		t.Errorf("two queued on c: external prefill %d, want %d", got, want)
	}
	r2.PrefillDone()
	f.Refresh(t0.Add(20 * time.Millisecond))
	if got, want := rt.ExternalPrefill(c), int64(1.5*4096); got != want {
		t.Errorf("one at its first token: external prefill %d, want %d", got, want)
	}
	r1.Release() // ended before its first token
	f.Refresh(t0.Add(30 * time.Millisecond))
	if got := rt.ExternalPrefill(c); got != 0 {
		t.Errorf("none queued: external prefill %d, want 0", got)
	}
	r2.Release()
}

// TestRouterQueued: once CountQueued is on, Queued counts the
// reservations before their first token (those made before it never):
// PrefillDone and a release before it take one out once, a release
// after it nothing, and Unregister drops the old generation's.
func TestRouterQueued(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 2)
	s := cands[0].Slot
	r0 := rt.Reserve(s, 100) // before CountQueued: never counted
	if got := rt.Queued(s); got != 0 {
		t.Fatalf("not counting: Queued %d, want 0", got)
	}
	rt.CountQueued()
	r1, r2, r3 := rt.Reserve(s, 100), rt.Reserve(s, 0), rt.Reserve(s, 50)
	r0.PrefillDone()
	r0.Release()
	if got := rt.Queued(s); got != 3 {
		t.Fatalf("three reserved: Queued %d, want 3", got)
	}
	r1.PrefillDone()
	r1.PrefillDone()
	r1.Release()
	if got := rt.Queued(s); got != 2 {
		t.Errorf("one past its first token and ended: Queued %d, want 2", got)
	}
	r2.Release()
	r2.Release()
	if got := rt.Queued(s); got != 1 {
		t.Errorf("one ended before its first token: Queued %d, want 1", got)
	}
	if got := rt.Queued(cands[1].Slot); got != 0 {
		t.Errorf("the other slot: Queued %d, want 0", got)
	}
	if !rt.Unregister("127.0.0.1:8000") {
		t.Fatal("Unregister failed")
	}
	if got := rt.Queued(s); got != 0 {
		t.Errorf("unregistered: Queued %d, want 0", got)
	}
	r3.PrefillDone() // the old generation's: changes nothing
	r3.Release()
	if got := rt.Queued(s); got != 0 {
		t.Errorf("old generation's reservation ended: Queued %d, want 0", got)
	}
}

// TestForeignPrefillQueueWait: QueueWait scales QueueCost's charge on a
// replica by its own requests' mean wait beyond prefill over QueueWait:
// nothing before any wait, half once the mean is half of it, whole past it.
func TestForeignPrefillQueueWait(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 512}, 3)
	a, b, c := cands[0].Slot, cands[1].Slot, cands[2].Slot
	f := NewForeignPrefill()
	f.QueueCost, f.QueueWait = 4096, time.Second
	f.SetRouter(rt)
	f.SetPrior(1)
	t0 := time.Unix(100, 0)
	res := rt.Reserve(a, 1024)
	f.Reserved(res, 0)
	f.StoredRun(a, 64, 16, t0) // our 1024 tokens
	res.PrefillDone()
	res.Release()
	f.StoredRun(b, 64, 16, t0) // 1024 foreign: rho 1

	r1 := rt.Reserve(c, 0)
	f.Reserved(r1, 0)
	if got := rt.ExternalPrefill(c); got != 0 {
		t.Errorf("no wait seen on c: external prefill %d, want 0", got)
	}
	f.FirstTokenAfter(c, t0, 0, 4*time.Second) // mean wait 4 s / 8 = 0.5 s
	r2 := rt.Reserve(c, 0)
	f.Reserved(r2, 0)
	if got, want := rt.ExternalPrefill(c), int64(2*4096/2); got != want {
		t.Errorf("mean wait 0.5 s, two queued: external prefill %d, want %d", got, want)
	}
	for range 16 {
		f.FirstTokenAfter(c, t0, 0, 4*time.Second)
	}
	f.Refresh(t0.Add(10 * time.Millisecond))
	if got, want := rt.ExternalPrefill(c), int64(2*4096); got != want {
		t.Errorf("mean wait past 1 s: external prefill %d, want %d", got, want)
	}
	r1.Release()
	r2.Release()
}

// TestForeignPrefillQueueWaitGates: QueueWaitShare scales QueueWait's
// charge by the share of replicas whose mean wait reaches QueueWait over
// QueueWaitShare. The speed is learned from one request (1024 tokens in
// 1 s); c's request of 512 tokens (0.5 s of prefill) takes 4.5 s: a wait
// of 4 s, a mean of 0.5 s.
func TestForeignPrefillQueueWaitGates(t *testing.T) {
	for _, tc := range []struct {
		name   string
		set    func(*ForeignPrefill)
		wantPx int64 // external prefill on c, two queued
	}{
		{"plain", func(*ForeignPrefill) {}, 4096}, // 0.5 s of 1 s
		{"share whole", func(f *ForeignPrefill) { f.QueueWait, f.QueueWaitShare = time.Second/2, 1.0/3 }, 8192},
		{"share part", func(f *ForeignPrefill) { f.QueueWait, f.QueueWaitShare = time.Second/2, 0.5 }, 5461}, // 1 of 3 replicas over 1.5
		{"none waiting", func(f *ForeignPrefill) { f.QueueWaitShare = 0.25 }, 0},                             // 0.5 s below the 1 s counted
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, cands := newTestRouter(t, Config{BlockTokens: 16, RequestCost: 512}, 3)
			a, b, c := cands[0].Slot, cands[1].Slot, cands[2].Slot
			f := NewForeignPrefill()
			f.QueueCost, f.QueueWait = 4096, time.Second
			tc.set(f)
			f.SetRouter(rt)
			f.SetPrior(1)
			t0 := time.Unix(100, 0)
			res := rt.Reserve(a, 1024)
			f.Reserved(res, 0)
			f.StoredRun(a, 64, 16, t0) // our 1024 tokens
			f.FirstTokenAfter(a, t0, 1024, time.Second)
			res.PrefillDone()
			res.Release()
			f.StoredRun(b, 64, 16, t0) // 1024 foreign: rho 1

			r1 := rt.Reserve(c, 0)
			f.Reserved(r1, 0)
			f.FirstTokenAfter(c, t0, 512, 4500*time.Millisecond)
			r2 := rt.Reserve(c, 0)
			f.Reserved(r2, 0)
			if got := rt.ExternalPrefill(c); got != tc.wantPx {
				t.Errorf("external prefill on c %d, want %d", got, tc.wantPx)
			}
			f.Reset(c) // c's replica left: its mean wait and its place among the waiting go with it
			if got := f.waiting.Load(); got != 0 {
				t.Errorf("after Reset(c): %d slots waiting, want 0", got)
			}
			if got := f.unseen(rt, c); got != 0 {
				t.Errorf("after Reset(c), two queued: unseen load %d, want 0 (no wait seen there)", got)
			}
			r1.Release()
			r2.Release()
		})
	}
}

// TestForeignEvidenceWindow: the others' share within EvidenceWindow is
// evidence of other instances too. A lone instance whose own runs are
// misread at 15% stays lone however long it runs, and one own run wholly
// misread after a quiet spell is not evidence (EvidenceMinOwn); another
// instance that starts storing as much as this one after an hour alone is
// seen within 0.3 EvidenceWindow, where the share since ever took 6 min 47 s
// (it needs the newcomer's share since ever past 0.25 less the 15%).
func TestForeignEvidenceWindow(t *testing.T) {
	rt, err := NewRouter(Config{})
	if err != nil {
		t.Fatal(err)
	}
	fp := NewForeignPrefill()
	fp.SetRouter(rt)
	now := time.Unix(1000, 0)
	// own stores one own request of 4096 tokens, 15% of it (its template's
	// tokens) past its credit, at now, then a second passes.
	own := func() {
		fp.Routed(0, 4096)
		fp.Stored(0, 256, 16, 4096, now)
		fp.Stored(0, 38, 16, 0, now) // 608 tokens past the credit, with nothing pending: foreign
		fp.FirstToken(0, now)
		now = now.Add(time.Second)
		fp.Refresh(now)
	}
	for range 3600 {
		own()
	}
	if rt.SawOthers() {
		t.Fatalf("a lone instance misread at 15%% for an hour saw others (rho %.3f)", fp.Share())
	}
	now = now.Add(time.Hour)
	fp.Routed(0, 4096)
	fp.Stored(0, 256, 16, 0, now.Add(time.Second)) // after a quiet hour, one own run misread whole
	fp.Refresh(now.Add(time.Second))
	if rt.SawOthers() {
		t.Fatal("one own run misread after a quiet spell saw others")
	}
	start := now
	for !rt.SawOthers() && now.Sub(start) < 20*time.Minute {
		own()
		fp.Stored(1, 256, 16, 0, now) // the other instance's request
	}
	if took := now.Sub(start); !rt.SawOthers() || took > EvidenceWindow*3/10 {
		t.Fatalf("the other instance seen after %s (%v): want within %s", took, rt.SawOthers(), EvidenceWindow*3/10)
	}
}

// StoredOwn: the credit covers a run first; past it, the blocks known to
// be this instance's (own) count as its own, the rest as foreign.
func TestForeignStoredOwn(t *testing.T) {
	const bt = 16
	at := time.Unix(100, 0)
	tests := []struct {
		name              string
		credit            int
		blocks, own       int
		wantForeign, mine int64
	}{
		{"no marks: as Stored", 64, 8, 0, 64, 64},
		{"marked past the credit", 0, 8, 8, 0, 128},
		{"part marked past the credit", 32, 8, 3, 48, 80},
		{"marks within the credit change nothing", 128, 8, 8, 0, 128},
		{"marks past the run are capped", 0, 4, 9, 0, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewForeignPrefill()
			f.Routed(0, tt.credit)
			if got := f.StoredOwn(0, tt.blocks, tt.own, bt, 1, at); got != tt.wantForeign {
				t.Errorf("foreign %d, want %d", got, tt.wantForeign)
			}
			if tok, _ := f.Counted(); int64(tok) != tt.wantForeign {
				t.Errorf("counted %d, want %d", tok, tt.wantForeign)
			}
			if mine := int64(f.own.Load()); mine != tt.mine {
				t.Errorf("own %d, want %d", mine, tt.mine)
			}
		})
	}
}

// StoredRunOwn takes the index's marks while the router has seen no other
// instance, and once it has (its load or their stored runs) not: the marks
// then cover the others' recomputing of contexts this instance also routed.
// With OwnInflight it takes its requests' blocks in flight instead, and not
// the credit, which covered the others' runs stored while this instance's
// prefill is pending.
func TestForeignStoredRunOwnUntilOthers(t *testing.T) {
	rt, cands := newTestRouter(t, Config{BlockTokens: 16}, 1)
	a := cands[0].Slot
	f := NewForeignPrefill()
	f.SetRouter(rt)
	t0 := time.Unix(100, 0)
	f.StoredRunOwn(a, 8, 8, 0, 16, t0) // alone: marked, its own
	if got, _ := f.Counted(); got != 0 {
		t.Fatalf("alone: %d foreign tokens, want 0", got)
	}
	rt.SetExternalLoad(a, 1, 0, 0) // another instance's request on a
	if !rt.SawOthers() {
		t.Fatal("the engine's load did not show the other instance")
	}
	f.StoredRunOwn(a, 8, 8, 0, 16, t0)
	if got, _ := f.Counted(); got != 128 {
		t.Fatalf("after others: %d foreign tokens, want 128 (the marks not taken)", got)
	}
	f.StoredRunOwn(a, 8, 0, 8, 16, t0) // its request's in flight, without OwnInflight
	if got, _ := f.Counted(); got != 256 {
		t.Fatalf("after others, its request's run without OwnInflight: %d foreign tokens, want 256", got)
	}
	f.OwnInflight = true
	f.StoredRunOwn(a, 8, 0, 8, 16, t0)
	if got, _ := f.Counted(); got != 256 {
		t.Fatalf("after others, its request's run: %d foreign tokens, want 256 (the earlier)", got)
	}
	f.Routed(a, 128) // its credit kept (a first token within Grace): another's run is still another's
	f.FirstToken(a, t0)
	f.StoredRunOwn(a, 8, 0, 0, 16, t0)
	if got, _ := f.Counted(); got != 384 {
		t.Fatalf("after others, credit pending: %d foreign tokens, want 384", got)
	}
}
