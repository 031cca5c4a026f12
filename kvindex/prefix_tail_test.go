package kvindex

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestPreflightPrefixTail: once cached prefixes are trusted, a request
// is routed at once only on a prefix that lacks at most prefixMaxTail
// trailing messages (the conversation's previous request). A prefix
// further back (another instance routed the turns between, or only the
// shared system prompt is known under an agent's own history) would tie
// every replica holding the shared part: the request waits for its
// preflight instead.
func TestPreflightPrefixTail(t *testing.T) {
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
	if _, agreed, _ := p.PrefixStats(); agreed != prefixTrustChecks {
		t.Fatalf("agreed %d, want %d", agreed, prefixTrustChecks)
	}

	gate := make(chan struct{})
	srv.gate.Store(&gate)
	defer close(gate)
	// Conversation 1's third request, its second never seen here: the
	// cached prefix (its first turn) lacks four messages.
	toks, late, err := preflight(50*time.Millisecond, sys, "q1", "r1", "q1b", "r1b", "q1c")
	if toks != nil || late == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("prefix four messages back: %d tokens, late %v, err %v; want a wait past the timeout", len(toks), late, err)
	}
	late.End()
	// Its second request: the first turn is the previous request.
	want, _ := chatTokens(chatBody(sys, "q1"))
	want = append(want, 1, 'a')
	toks, late, err = preflight(50*time.Millisecond, sys, "q1", "r1", "q1b")
	if err != nil || late == nil || !slices.Equal(toks, want) {
		t.Fatalf("the next turn: tokens %v, late %v, err %v; want the first turn's %v at once", toks, late, err, want)
	}
	late.End()
	if routed, _, _ := p.PrefixStats(); routed != 1 {
		t.Errorf("routed by a prefix: %d, want 1", routed)
	}
}
