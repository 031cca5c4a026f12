package engine

import (
	"math"
	"slices"
	"testing"
)

func TestTokenizeText(t *testing.T) {
	tests := []struct {
		give string
		want int
	}{
		{"", 0}, {"a", 1}, {"abcd", 1}, {"abcde", 2}, {`{"city":"Paris"}`, 4},
	}
	for _, tt := range tests {
		if got := len(TokenizeText(nil, tt.give)); got != tt.want || CountTextTokens(tt.give) != tt.want {
			t.Errorf("tokens(%q) = %d, want %d", tt.give, got, tt.want)
		}
	}
	a, b := TokenizeText(nil, "hello world"), TokenizeText(nil, "hello world")
	for i := range a {
		if a[i] != b[i] || a[i] >= VocabSize {
			t.Fatalf("token %d: %d vs %d", i, a[i], b[i])
		}
	}
}

func TestSyntheticText(t *testing.T) {
	for _, n := range []int{1, 7, 100, 1000} {
		s := SyntheticText(uint64(n), n)
		if got := len(TokenizeText(nil, s)); got != n {
			t.Errorf("SyntheticText(%d) has %d tokens", n, got)
		}
		if s != SyntheticText(uint64(n), n) {
			t.Error("SyntheticText not deterministic")
		}
	}
	if SyntheticText(1, 50) == SyntheticText(2, 50) {
		t.Error("different seeds gave the same text")
	}
}

func TestRenderChatToolsInSystem(t *testing.T) {
	tools := []string{`{"type":"function","function":{"name":"f"}}`}
	with := RenderChat(nil, tools, []Message{{Role: "user", Content: "hi"}}, true)
	without := RenderChat(nil, nil, []Message{{Role: "user", Content: "hi"}}, true)
	if with[0] != TokenIMStart || len(with) <= len(without) {
		t.Fatalf("tools not rendered in a system part: %d vs %d tokens", len(with), len(without))
	}
	// The user turn is the same suffix either way.
	for i := 1; i <= len(without); i++ {
		if with[len(with)-i] != without[len(without)-i] {
			t.Fatalf("suffix differs at -%d", i)
		}
	}
}

func TestTokenizerDensity(t *testing.T) {
	text := SyntheticText(3, 400) // 1,600 bytes
	for _, d := range []float64{0, 1, 2.5, 3.3, 4, 4.2, 5, 7.75} {
		tk := Tokenizer{Density: d}
		if err := tk.Validate(); err != nil {
			t.Fatal(err)
		}
		bpt := tk.BytesPerToken()
		for n := 0; n <= len(text); n += 37 {
			s := text[:n]
			toks := tk.Text(nil, s)
			want := int(math.Ceil(float64(n) / bpt))
			if len(toks) != want || tk.Count(s) != want {
				t.Fatalf("D=%g: %d bytes gave %d tokens (Count %d), want ceil(n/D) = %d", d, n, len(toks), tk.Count(s), want)
			}
			if !slices.Equal(toks, tk.Text(nil, s)) {
				t.Fatalf("D=%g: not deterministic", d)
			}
			// Prefix property: cut at token k's boundary, the prefix's
			// tokens are the text's first k.
			k := len(toks) / 2
			if pre := tk.Text(nil, s[:tk.Cut(k)]); !slices.Equal(pre, toks[:k]) {
				t.Fatalf("D=%g: the tokens of the first %d tokens' bytes are not the text's first %d", d, k, k)
			}
		}
		// Cuts are floor(i x D).
		for i := range 50 {
			if got, want := tk.Cut(i), int(math.Floor(float64(i)*bpt+1e-9)); got != want {
				t.Fatalf("D=%g: Cut(%d) = %d, want %d", d, i, got, want)
			}
		}
		for _, n := range []int{1, 7, 100, 1000} {
			s := tk.SyntheticText(uint64(n), n)
			if got := len(tk.Text(nil, s)); got != n || len(s) != tk.Cut(n) {
				t.Errorf("D=%g: SyntheticText(%d) has %d tokens in %d bytes", d, n, got, len(s))
			}
		}
	}
	// The default is byte-identical to the package's functions.
	if !slices.Equal((Tokenizer{Density: 4}).Text(nil, text), TokenizeText(nil, text)) ||
		(Tokenizer{}).SyntheticText(9, 123) != SyntheticText(9, 123) {
		t.Fatal("density 4 differs from the default")
	}
	// 2.5 bytes per token: pieces of 2 and 3 bytes, 4 tokens per 10 bytes.
	if got := (Tokenizer{Density: 2.5}).Text(nil, "abcdefghij"); len(got) != 4 || got[0] != pieceID("ab") || got[1] != pieceID("cde") {
		t.Fatalf("2.5: %v", got)
	}
	for _, bad := range []float64{-1, 0.5, 65, math.NaN()} {
		if (Tokenizer{Density: bad}).Validate() == nil {
			t.Errorf("density %g accepted", bad)
		}
	}
}

func TestRenderChatDensity(t *testing.T) {
	// A message of n tokens' bytes at D is n tokens of the body at D, so a
	// rendering's length differs from the default's only by the fixed
	// parts (role, separators), and a longer history extends a shorter one.
	tk := Tokenizer{Density: 2.5}
	sys, user := tk.SyntheticText(1, 300), tk.SyntheticText(2, 50)
	short := tk.RenderChat(nil, nil, []Message{{Role: "system", Content: sys}, {Role: "user", Content: user}}, false)
	long := tk.RenderChat(nil, nil, []Message{{Role: "system", Content: sys}, {Role: "user", Content: user}, {Role: "assistant", Content: "ok"}}, true)
	if !slices.Equal(long[:len(short)], short) {
		t.Fatal("a longer history does not extend the shorter one's tokens")
	}
	// <|im_start|> "system\n" body <|im_end|> "\n" twice.
	want := 2*2 + tk.Count("system\n") + 300 + tk.Count("user\n") + 50 + 2*tk.Count("\n")
	if len(short) != want {
		t.Fatalf("%d tokens, want %d", len(short), want)
	}
	if def := RenderChat(nil, nil, []Message{{Role: "system", Content: sys}, {Role: "user", Content: user}}, false); len(def) >= len(short) {
		t.Fatalf("the same bytes at 4 bytes per token gave %d tokens, at 2.5 %d", len(def), len(short))
	}
}
