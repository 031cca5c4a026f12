package kvindex

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

// TestColdStartCredit: the module sets the estimate's router (SetEstimate,
// at its first pool view) only when the first request is routed, after
// that request's cold-start preflight was sent. The preflight's late
// tokens must still credit what the engine stores past the reservation's
// bytes' estimate: before, the handle had no estimate, credited nothing,
// and where content is denser than chars_per_token (here one token per
// byte; through HTTP 2.5 bytes per token, 37.5% of the first prompt) the
// first request's own runs read as another instance's prefill, past
// selection.ForeignEvidenceShare at once: a lone instance then waited for
// every preflight for good (tool-agent window at 2.5 bytes per token: 199
// of 199).
func TestColdStartCredit(t *testing.T) {
	srv := newTokenizeServer(t)
	srv.gate = make(chan struct{})
	p, _, _, sb := twoEngines(t, srv, Config{BlockSize: 1}, time.Second)
	if !p.Cold() {
		t.Fatal("not the cold start")
	}
	rt, err := selection.NewRouter(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fp := selection.NewForeignPrefill()
	fp.SetRouter(rt)
	p.SetForeign(fp)
	prompt := strings.Repeat("abcdefgh", 50) // 400 bytes: 400 tokens, 100 by the bytes' estimate
	body := []byte(`{"model":"m","prompt":"` + prompt + `","max_tokens":1}`)
	f := rt.Extractor().NewFeatures()
	if err := rt.Extractor().Parse(selection.EndpointCompletions, body, f); err != nil {
		t.Fatal(err)
	}
	var routed atomic.Bool
	late := p.ColdPreflight(selection.EndpointCompletions, body, f, func() (selection.Slot, bool) { return sb, routed.Load() })
	if late == nil {
		t.Fatal("no cold preflight sent")
	}
	// The first pool view: the estimate's router is set, the request
	// routed to b by the estimate, its reservation crediting the bytes'.
	p.SetEstimate(rt)
	est := f.PromptTokens(rt.Config())
	fp.Routed(sb, est)
	routed.Store(true)
	close(srv.gate)
	eventually(t, "the cold preflight's tokens", func() bool { return p.LateOutcomes(LatePredicted) == 1 })
	n := len(prompt)
	if est <= 0 || n <= est {
		t.Fatalf("premise: estimate %d, tokens %d", est, n)
	}
	fp.Stored(sb, n, 1, int64(est), time.Unix(100, 0)) // the engine stores the whole prompt
	if got, _ := fp.Counted(); got != 0 {
		t.Errorf("%d of the first request's %d stored tokens read as foreign (estimate %d), want 0", got, n, est)
	}
	late.End()
}
