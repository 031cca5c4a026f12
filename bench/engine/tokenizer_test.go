package engine

import "testing"

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
