package kvindex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestHoldLivesUntilEventsOrEnd checks that a held prediction outlives
// any wall-clock TTL shorter than its request (a long queue plus
// prefill), ends when the engine confirms it, and otherwise ends grace
// after the last request holding it ends, or at its upper bound.
func TestHoldLivesUntilEventsOrEnd(t *testing.T) {
	now := time.Unix(1000, 0)
	x := New(Config{BlockSize: 2, Now: func() time.Time { return now }})
	a, _ := x.Register("a")
	b, _ := x.Register("b")
	prompt := seqTokens(0, 8)
	keys := x.Keys(nil, 0, prompt)
	x.Apply(a, batchOf(storedEv(0, false, 2, seqTokens(60, 2), 1)))
	x.Apply(b, batchOf(storedEv(0, false, 2, seqTokens(50, 2), 2)))
	out := make([]int, 2)
	overlap := func() []int { x.Overlap(keys, out); return append([]int(nil), out...) }

	// Two requests of the same prompt routed to b, both still queued a
	// minute later: their blocks still count for b.
	x.Hold(b, keys, 5*time.Minute)
	x.Hold(b, keys, 5*time.Minute)
	now = now.Add(time.Minute)
	if got, want := overlap(), []int{0, 8}; !cmp.Equal(got, want) {
		t.Fatalf("a minute later: %v, want %v", got, want)
	}
	// The engine stores the first two blocks: confirmed, no longer predicted.
	x.Apply(b, batchOf(storedEv(0, false, 2, prompt[:4], 11, 12)))
	if x.Predicted() != 2 {
		t.Fatalf("predicted %d after two blocks were confirmed, want 2", x.Predicted())
	}
	// The first request ends: the second still holds the rest.
	x.Release(b, keys, 2*time.Second)
	now = now.Add(10 * time.Second)
	if got, want := overlap(), []int{0, 8}; !cmp.Equal(got, want) {
		t.Fatalf("one holder left: %v, want %v", got, want)
	}
	// The second ends: grace, then gone.
	x.Release(b, keys, 2*time.Second)
	now = now.Add(time.Second)
	if got, want := overlap(), []int{0, 8}; !cmp.Equal(got, want) {
		t.Fatalf("within grace: %v, want %v", got, want)
	}
	now = now.Add(1500 * time.Millisecond)
	if got, want := overlap(), []int{0, 4}; !cmp.Equal(got, want) {
		t.Fatalf("past grace: %v, want %v", got, want)
	}
	x.Predict(a, nil, time.Second) // sweeps
	if x.Predicted() != 0 {
		t.Fatalf("predicted %d after grace, want 0", x.Predicted())
	}
	// A release with nothing held changes nothing; a hold nobody releases
	// ends at its upper bound.
	x.Release(a, keys, time.Second)
	x.Hold(a, keys, 5*time.Minute)
	x.Release(a, nil, time.Second)
	now = now.Add(4 * time.Minute)
	if got, want := overlap(), []int{8, 4}; !cmp.Equal(got, want) {
		t.Fatalf("unreleased hold within its bound: %v, want %v", got, want)
	}
	now = now.Add(2 * time.Minute)
	if got, want := overlap(), []int{0, 4}; !cmp.Equal(got, want) {
		t.Fatalf("unreleased hold past its bound: %v, want %v", got, want)
	}
}

// TestPredictionsBounded checks the memory bound and its counter.
func TestPredictionsBounded(t *testing.T) {
	now := time.Unix(0, 0)
	x := New(Config{BlockSize: 1, MaxPredicted: 5, Now: func() time.Time { return now }})
	c, _ := x.Register("c")
	keys := x.Keys(nil, 0, seqTokens(0, 20))
	x.Hold(c, keys, time.Hour)
	if x.Predicted() != 5 || x.PredictionsDropped() != 15 {
		t.Fatalf("predicted %d dropped %d, want 5 and 15", x.Predicted(), x.PredictionsDropped())
	}
	// Releases queue on their own ring, bounded too.
	x.Release(c, keys, time.Second)
	if x.Predicted() != 5 {
		t.Fatalf("predicted %d after release, want 5 until grace passes", x.Predicted())
	}
	now = now.Add(2 * time.Second)
	x.Predict(c, nil, time.Second)
	if x.Predicted() != 0 {
		t.Fatalf("predicted %d after grace", x.Predicted())
	}
}

// twoEngines is a Precise over replicas "a" and "b" that tokenize at srv
// (no feeds: the test applies their events), bound to a router's slots.
func twoEngines(t *testing.T, srv *tokenizeServer, ic Config, timeout time.Duration) (*Precise, *selection.Router, selection.Slot, selection.Slot) {
	t.Helper()
	p, err := NewPrecise(PreciseConfig{
		Index:     ic,
		Engines:   []PreciseEngine{{Feed: Endpoint{Replica: "a"}, BaseURL: srv.URL}, {Feed: Endpoint{Replica: "b"}, BaseURL: srv.URL}},
		Tokenizer: TokenizerConfig{Timeout: timeout, LateTimeout: time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rt, _ := selection.NewRouter(selection.Config{})
	sa, _ := rt.Register("a")
	sb, _ := rt.Register("b")
	p.Bind(sa, "a")
	p.Bind(sb, "b")
	return p, rt, sa, sb
}

// TestLatePreflightPredicts checks that a preflight past its timeout
// does not lose the prediction: the request is routed by the estimate,
// and when the engine's answer comes the chosen replica's blocks are
// predicted (held until the request ends, then grace).
func TestLatePreflightPredicts(t *testing.T) {
	srv := newTokenizeServer(t)
	srv.gate = make(chan struct{})
	var clock atomic.Int64
	clock.Store(time.Unix(100, 0).UnixNano())
	p, _, sa, sb := twoEngines(t, srv, Config{BlockSize: 1, Now: func() time.Time { return time.Unix(0, clock.Load()) }}, 20*time.Millisecond)
	ra, _ := p.Index().Lookup("a")
	rb, _ := p.Index().Lookup("b")
	p.Index().Apply(ra, batchOf(storedEv(0, false, 1, []uint32{200}, 1)))
	p.Index().Apply(rb, batchOf(storedEv(0, false, 1, []uint32{201}, 2)))

	req := promptReq("hello") // the server's tokens: the bytes
	var routed atomic.Bool
	toks, late, err := p.Preflight(context.Background(), 1, req, func() (selection.Slot, bool) {
		return sb, routed.Load()
	})
	if !errors.Is(err, context.DeadlineExceeded) || toks != nil || late == nil {
		t.Fatalf("preflight past its timeout: tokens %v late %v err %v", toks, late, err)
	}
	if n, d := p.Waited(); n != 1 || d < 20*time.Millisecond {
		t.Fatalf("waited %d preflights for %v, want 1 for at least the 20ms timeout", n, d)
	}
	routed.Store(true) // the estimate chose b
	srv.gate <- struct{}{}
	eventually(t, "late tokens predicted on b", func() bool { return p.LateOutcomes(LatePredicted) == 1 })
	out := make([]int, 2)
	toksGot, ok := p.Tokenizer().Cached(1)
	if !ok {
		t.Fatal("late tokens not cached")
	}
	all := p.Index().Keys(nil, 0, toksGot)
	p.Index().Overlap(all, out)
	if want := []int{0, len(toksGot)}; !cmp.Equal(out, want) {
		t.Fatalf("overlap after the late prediction: %v, want %v", out, want)
	}
	// A second Routed without a retry changes nothing.
	late.Routed(sa)
	p.Index().Overlap(all, out)
	if want := []int{0, len(toksGot)}; !cmp.Equal(out, want) {
		t.Fatalf("overlap after a second Routed: %v, want %v", out, want)
	}
	// A retry moves the prediction: b's lives the grace, a's until the end.
	late.Retried()
	late.Routed(sa)
	p.Index().Overlap(all, out)
	if want := []int{len(toksGot), len(toksGot)}; !cmp.Equal(out, want) {
		t.Fatalf("overlap right after the retry to a: %v, want %v", out, want)
	}
	clock.Add(int64(3 * time.Second))
	p.Index().Overlap(all, out)
	if want := []int{len(toksGot), 0}; !cmp.Equal(out, want) {
		t.Fatalf("overlap past grace after the retry: %v, want %v (the first replica still predicted)", out, want)
	}
	// The end starts a's grace.
	late.End()
	late.End()
	late.Retried() // after the end: nothing
	clock.Add(int64(3 * time.Second))
	p.Index().Overlap(all, out)
	if want := []int{0, 0}; !cmp.Equal(out, want) {
		t.Fatalf("overlap past grace after the end: %v, want %v", out, want)
	}

	// A late answer after the request ended predicts nothing.
	_, late2, err := p.Preflight(context.Background(), 2, promptReq("other"), nil)
	if late2 == nil {
		t.Fatalf("second preflight: %v", err)
	}
	late2.Routed(sa)
	late2.End()
	srv.gate <- struct{}{}
	eventually(t, "late answer after the end", func() bool { return p.LateOutcomes(LateAfterEnd) == 1 })
	if p.Index().Predicted() != 0 || p.LateOutcomes(LatePredicted) != 2 { // b, then a after the retry
		t.Fatalf("predicted %d, late predicted %d after a late answer past the end", p.Index().Predicted(), p.LateOutcomes(LatePredicted))
	}
}

// TestTokenizerStopsWaitingForSlowEngines: once most preflights miss the
// timeout, requests stop waiting (ErrSlow at once) while the preflights go
// on; when the engine answers in time again, waiting resumes.
func TestTokenizerStopsWaitingForSlowEngines(t *testing.T) {
	var delay atomic.Int64
	delay.Store(int64(time.Second))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(time.Duration(delay.Load())):
		case <-r.Context().Done():
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"tokens": []int{1, 2}, "count": 2})
	}))
	defer srv.Close()
	tk := NewTokenizer(TokenizerConfig{Timeout: 200 * time.Millisecond, LateTimeout: 5 * time.Second})
	ctx := context.Background()
	key := uint64(0)
	next := func() ([]uint32, error) {
		key++
		return tk.Tokenize(ctx, srv.URL, key, promptReq(fmt.Sprint(key)))
	}
	// Each call waits its 200 ms and misses; the breaker opens once the
	// misses (1 s each) have been measured.
	eventually(t, "the breaker open", func() bool {
		next()
		return tk.Slow()
	})
	start := time.Now()
	if _, err := next(); !errors.Is(err, ErrSlow) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("while slow: %v, want ErrSlow", err)
	}
	if d := time.Since(start); d > 10*tk.cfg.Timeout {
		t.Errorf("ErrSlow after %v: waited", d)
	}
	if tk.Fallbacks(FallbackSlow) == 0 {
		t.Error("no slow fallbacks counted")
	}
	// The engine is fast again: the preflights still sent measure it, and
	// waiting resumes.
	delay.Store(0)
	eventually(t, "the breaker closed", func() bool {
		next()
		return !tk.Slow()
	})
	eventually(t, "tokens after recovery", func() bool {
		toks, err := next()
		return err == nil && len(toks) == 2
	})
}

// TestColdPreflightPredicts: in the cold start (no feed fresh, so no
// preflight is waited for) a request's tokenization still runs, in the
// background, and its tokens predict the blocks of the replica the
// estimate routed it to, before that replica's feed is fresh: when the
// feed turns fresh with the first chunk of the request's prefill, the
// exact overlap is the whole prompt, not the part stored so far. Once a
// feed is fresh the cold start is over.
func TestColdPreflightPredicts(t *testing.T) {
	srv := newTokenizeServer(t)
	srv.gate = make(chan struct{})
	p, rt, _, sb := twoEngines(t, srv, Config{BlockSize: 1}, time.Second)
	rb, _ := p.Index().Lookup("b")
	if p.Ready() || !p.Cold() {
		t.Fatalf("ready %v cold %v before any event, want the cold start", p.Ready(), p.Cold())
	}

	body := []byte(`{"model":"m","prompt":"abcdefgh","max_tokens":1}`)
	f := rt.Extractor().NewFeatures()
	if err := rt.Extractor().Parse(selection.EndpointCompletions, body, f); err != nil {
		t.Fatal(err)
	}
	var routed atomic.Bool
	late := p.ColdPreflight(selection.EndpointCompletions, body, f, func() (selection.Slot, bool) { return sb, routed.Load() })
	if late == nil {
		t.Fatal("no cold preflight sent")
	}
	routed.Store(true) // the estimate chose b; nothing waited for the tokens
	srv.gate <- struct{}{}
	eventually(t, "the cold preflight's tokens predicted on b", func() bool { return p.LateOutcomes(LatePredicted) == 1 })
	var toks []uint32 // the server's tokens: the prompt's bytes
	for _, c := range []byte("abcdefgh") {
		toks = append(toks, uint32(c))
	}
	keys := p.Index().Keys(nil, 0, toks)
	out := make([]int, 2)
	p.Index().Overlap(keys, out)
	if want := []int{0, 0}; !cmp.Equal(out, want) {
		t.Fatalf("overlap while no feed is fresh: %v, want %v", out, want)
	}
	// b's first chunk is stored: its feed turns fresh, and the exact
	// overlap counts the predicted rest.
	p.Index().Apply(rb, batchOf(storedEv(0, false, 1, toks[:4], 1, 2, 3, 4)))
	p.Index().Overlap(keys, out)
	if want := []int{0, len(toks)}; !cmp.Equal(out, want) {
		t.Fatalf("overlap once b's first chunk landed: %v, want %v (the whole prompt)", out, want)
	}
	if p.Cold() {
		t.Fatal("still cold with a fresh feed")
	}
	late.End()
}
