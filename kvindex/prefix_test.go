package kvindex

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ramjet-llm/ramjet/selection"
)

func TestMessageEnds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string // the elements, as messageEnds cuts them
		ok   bool
	}{
		{`[]`, nil, true},
		{` [ {"a":1} ] `, []string{` [ {"a":1}`}, true},
		{`[{"a":1},{"b":[1,2,{"c":"]"}]}]`, []string{`[{"a":1}`, `,{"b":[1,2,{"c":"]"}]}`}, true},
		{"[{\"s\":\"x,\\\"}],y\"} ,\n {\"t\":2}\n]", []string{"[{\"s\":\"x,\\\"}],y\"}", " ,\n {\"t\":2}"}, true},
		{`["str",3,null]`, []string{`["str"`, `,3`, `,null`}, true},
		{`{"a":1}`, nil, false},
		{`[{"a":1}`, []string{`[{"a":1}`}, false},
		{`[,{"a":1}]`, nil, false},
		{`[{"a":1}}`, nil, false},
		{``, nil, false},
	} {
		ends, ok := messageEnds(nil, []byte(tc.in))
		if ok != tc.ok {
			t.Errorf("%q: ok %v, want %v", tc.in, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		var got []string
		prev := 0
		for _, e := range ends {
			got = append(got, tc.in[prev:e])
			prev = int(e)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: elements %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestPrefixKeys(t *testing.T) {
	keys := func(model, tools, msgs string) []uint64 {
		ends, ok := messageEnds(nil, []byte(msgs))
		if !ok {
			t.Fatalf("%s: not split", msgs)
		}
		return prefixKeys(nil, model, []byte(tools), []byte(msgs), ends)
	}
	a := keys("m", "", `[{"role":"system","content":"s"},{"role":"user","content":"u1"}]`)
	b := keys("m", "", `[{"role":"system","content":"s"},{"role":"user","content":"u2"},{"role":"user","content":"u3"}]`)
	if len(a) != 2 || len(b) != 3 || a[0] != b[0] || a[1] == b[1] {
		t.Fatalf("keys %x and %x: want the first equal, the second different", a, b)
	}
	if c := keys("other", "", `[{"role":"system","content":"s"}]`); c[0] == a[0] {
		t.Fatal("another model shares the prefix key")
	}
	if c := keys("m", `[{"type":"function"}]`, `[{"role":"system","content":"s"}]`); c[0] == a[0] {
		t.Fatal("other tools share the prefix key")
	}
}

// chatTokenizer is an engine's /tokenize for chats: each message renders
// as <start> role content <end>, the generation prompt as <start> 'a'
// (ChatML's shape: a conversation's tokens extend its prefixes' tokens).
// With reversed, the tokens come reversed: a template that keeps no
// prefix. gate, when set, holds every answer until it receives.
type chatTokenizer struct {
	*httptest.Server
	reversed bool
	gate     atomic.Pointer[chan struct{}]
	calls    atomic.Int64
}

func newChatTokenizer(t *testing.T, reversed bool) *chatTokenizer {
	s := &chatTokenizer{reversed: reversed}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.calls.Add(1)
		if g := s.gate.Load(); g != nil {
			select {
			case <-*g:
			case <-r.Context().Done():
				return
			}
		}
		body, _ := io.ReadAll(r.Body)
		toks, err := chatTokens(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if s.reversed {
			slices.Reverse(toks)
		}
		json.NewEncoder(w).Encode(map[string]any{"count": len(toks), "tokens": toks})
	}))
	t.Cleanup(s.Close)
	return s
}

func chatTokens(body []byte) ([]uint32, error) {
	var req struct {
		Messages []struct{ Role, Content string } `json:"messages"`
		AddGen   bool                             `json:"add_generation_prompt"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	var toks []uint32
	for _, m := range req.Messages {
		toks = append(toks, 1, uint32(m.Role[0]))
		for _, c := range []byte(m.Content) {
			toks = append(toks, 100+uint32(c))
		}
		toks = append(toks, 2)
	}
	if req.AddGen {
		toks = append(toks, 1, 'a')
	}
	return toks, nil
}

func chatBody(msgs ...string) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, c := range msgs {
		role := "user"
		switch {
		case i == 0:
			role = "system"
		case i%2 == 0:
			role = "assistant"
		}
		ms = append(ms, msg{role, c})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": ms, "max_tokens": 8})
	return b
}

// prefixPrecise is a precise path over one replica "a" (fresh, block 4)
// behind the chat tokenizer srv, and preflight, which parses a chat of msgs
// and preflights it with timeout.
func prefixPrecise(t *testing.T, srv *chatTokenizer) (*Precise, func(timeout time.Duration, msgs ...string) ([]uint32, *Late, error)) {
	t.Helper()
	p, err := NewPrecise(PreciseConfig{
		Index:     Config{BlockSize: 4},
		Engines:   []PreciseEngine{{Feed: Endpoint{Replica: "a"}, BaseURL: srv.URL}},
		Tokenizer: TokenizerConfig{Timeout: time.Minute, LateTimeout: time.Minute},
		WaitAuto:  true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ra, _ := p.Index().Lookup("a")
	p.Index().Apply(ra, batchOf(storedEv(0, false, 4, []uint32{9, 9, 9, 9}, 1))) // fresh
	rt, err := selection.NewRouter(selection.Config{})
	if err != nil {
		t.Fatal(err)
	}
	x := rt.Extractor()
	return p, func(timeout time.Duration, msgs ...string) ([]uint32, *Late, error) {
		t.Helper()
		body := chatBody(msgs...)
		f := x.NewFeatures()
		if err := x.Parse(selection.EndpointChat, body, f); err != nil {
			t.Fatal(err)
		}
		return p.PreflightBody(context.Background(), selection.EndpointChat, body, f, timeout, nil)
	}
}

// TestPreflightMessagePrefix: chats under one system prompt teach the
// message-prefix cache (the system prompt's tokens from one background
// tokenization, each conversation's from its own); once four of them
// agreed with their full tokenizations, a new question under the prompt,
// and a conversation's next turn, are routed on their cached prefix at
// once while the engine has not answered yet, their own preflights sent
// only when their responses begin. Under a template that keeps no prefix
// the comparisons disagree and requests keep waiting.
func TestPreflightMessagePrefix(t *testing.T) {
	for _, reversed := range []bool{false, true} {
		t.Run("reversed="+strconv.FormatBool(reversed), func(t *testing.T) {
			srv := newChatTokenizer(t, reversed)
			p, preflight := prefixPrecise(t, srv)
			sys := "a shared system prompt, several blocks long"
			engine := func(msgs ...string) []uint32 { // the template before reversing, no reply header
				toks, _ := chatTokens(chatBody(msgs...))
				return toks
			}
			withReply := func(msgs ...string) []uint32 { return append(engine(msgs...), 1, 'a') }

			// The first question: waited for; the system prompt's own
			// tokenization follows in the background.
			toks, late, err := preflight(time.Minute, sys, "q0")
			if err != nil || late != nil || len(toks) == 0 {
				t.Fatalf("first preflight: %d tokens, late %v, err %v", len(toks), late, err)
			}
			// Cached: the body, its messages and the system prompt's.
			eventually(t, "system prompt tokenized", func() bool { n, _ := p.Tokenizer().CacheLen(); return n == 3 })
			for i := 1; i <= prefixTrustChecks; i++ {
				if toks, late, err := preflight(time.Minute, sys, "q"+strconv.Itoa(i)); err != nil || late != nil || len(toks) == 0 {
					t.Fatalf("question %d: %d tokens, late %v, err %v", i, len(toks), late, err)
				}
			}
			routed, agreed, disagreed := p.PrefixStats()
			if reversed {
				if routed != 0 || agreed != 0 || disagreed != prefixTrustChecks {
					t.Fatalf("reversed template: routed %d, agreed %d, disagreed %d; want 0, 0, %d", routed, agreed, disagreed, prefixTrustChecks)
				}
			} else if routed != 0 || agreed != prefixTrustChecks || disagreed != 0 {
				t.Fatalf("prefix comparisons: routed %d, agreed %d, disagreed %d; want 0, %d, 0", routed, agreed, disagreed, prefixTrustChecks)
			}

			// The engine stops answering: a new question under the prompt.
			gate := make(chan struct{})
			srv.gate.Store(&gate)
			calls := srv.calls.Load()
			toks, late, err = preflight(50*time.Millisecond, sys, "new question")
			if reversed {
				if toks != nil || late == nil || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("untrusted prefixes: %d tokens, late %v, err %v; want a wait past the timeout", len(toks), late, err)
				}
				late.End()
				close(gate)
				return
			}
			if err != nil || late == nil || !slices.Equal(toks, engine(sys)) {
				t.Fatalf("new question: tokens %v, late %v, err %v; want the system prompt's %v at once", toks, late, err, engine(sys))
			}
			// The next turn of conversation 1: the whole first turn, with
			// the reply's header, is its prefix.
			toks, late2, err := preflight(50*time.Millisecond, sys, "q1", "the reply", "and then?")
			if first := withReply(sys, "q1"); err != nil || late2 == nil || !slices.Equal(toks, first) {
				t.Fatalf("next turn: tokens %v, late %v, err %v; want the first turn's %v", toks, late2, err, first)
			}
			if routed, _, _ := p.PrefixStats(); routed != 2 {
				t.Fatalf("routed by a prefix: %d, want 2", routed)
			}
			// Their own preflights wait for the responses to begin (the
			// first token), off the engine's way to it.
			if got := srv.calls.Load(); got != calls {
				t.Fatalf("%d preflights sent before the responses began, want 0", got-calls)
			}
			late.FirstByte()
			late2.FirstByte()
			late2.FirstByte() // once
			eventually(t, "both preflights sent", func() bool { return srv.calls.Load() == calls+2 })
			close(gate)
			// Their answers teach the cache: the next turn's own tokens
			// are now its messages' prefix, and they agreed.
			eventually(t, "late answers learned", func() bool { _, agreed, _ := p.PrefixStats(); return agreed == prefixTrustChecks+2 })
			late.End()
			late2.End()
			calls = srv.calls.Load()
			toks, late, err = preflight(time.Minute, sys, "q1", "the reply", "and then?", "more", "last")
			if want := withReply(sys, "q1", "the reply", "and then?"); err != nil || late == nil || !slices.Equal(toks, want) {
				t.Fatalf("third turn: tokens %v, late %v, err %v; want the second turn's %v", toks, late, err, want)
			}
			// A request that ends before any response byte still sends
			// its deferred preflight, which teaches the cache its turn.
			late.End()
			eventually(t, "deferred preflight sent at the end", func() bool { return srv.calls.Load() == calls+1 })
			eventually(t, "third turn learned", func() bool { _, agreed, _ := p.PrefixStats(); return agreed == prefixTrustChecks+3 })
		})
	}
}
