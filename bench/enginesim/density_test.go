package enginesim

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ramjet-llm/ramjet/bench/engine"
)

// TestDensityUsage runs engines of three densities side by side: each counts
// a prompt rendered at its own density as the rendered tokens (usage,
// /tokenize, PromptTokensAt agree), its reply is exactly the asked tokens at
// that density, and the reply sent back as history is cached as such.
func TestDensityUsage(t *testing.T) {
	for _, d := range []float64{2.5, 4, 5} {
		t.Run(fmt.Sprint(d), func(t *testing.T) {
			t.Parallel()
			s := startSim(t, Options{Model: "m", Density: d, Instant: true})
			tok := engine.Tokenizer{Density: d}
			sys, user := tok.SyntheticText(1, 600), tok.SyntheticText(2, 40)
			msgs := []engine.Message{{Role: "system", Content: sys}, {Role: "user", Content: user}}
			body := func(ms []engine.Message) string {
				var raw []map[string]string
				for _, m := range ms {
					raw = append(raw, map[string]string{"role": m.Role, "content": m.Content})
				}
				b, _ := json.Marshal(map[string]any{"model": "m", "messages": raw, "max_tokens": 33})
				return string(b)
			}
			want := tok.RenderChat(nil, nil, msgs, true)
			// 600 + 40 body tokens; the template's fixed parts at d.
			if n := 600 + 40 + 2*2 + tok.Count("system\n") + tok.Count("user\n") + 2*tok.Count("\n") + 1 + tok.Count("assistant\n"); len(want) != n {
				t.Fatalf("rendered %d tokens, want %d", len(want), n)
			}
			st, b := postJSON(t, s.URL()+"/tokenize", body(msgs), nil)
			var tk struct {
				Count int `json:"count"`
			}
			if err := json.Unmarshal(b, &tk); st != 200 || err != nil || tk.Count != len(want) {
				t.Fatalf("tokenize: %d %s, want count %d", st, b, len(want))
			}
			if got, err := PromptTokensAt([]byte(body(msgs)), true, tok); err != nil || len(got) != len(want) {
				t.Fatalf("PromptTokensAt: %d tokens, %v", len(got), err)
			}
			type usage struct {
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
				Usage struct {
					Prompt     int `json:"prompt_tokens"`
					Completion int `json:"completion_tokens"`
					Details    struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			var r1 usage
			st, b = postJSON(t, s.URL()+"/v1/chat/completions", body(msgs), nil)
			if err := json.Unmarshal(b, &r1); st != 200 || err != nil || len(r1.Choices) != 1 {
				t.Fatalf("chat: %d %s", st, b)
			}
			if r1.Usage.Prompt != len(want) || r1.Usage.Completion != 33 {
				t.Fatalf("usage prompt %d completion %d, want %d and 33", r1.Usage.Prompt, r1.Usage.Completion, len(want))
			}
			reply := r1.Choices[0].Message.Content
			// 32 tokens of body and <|im_end|>: the reply's bytes are 32
			// tokens at d.
			if len(reply) != tok.Cut(32) || tok.Count(reply) != 32 {
				t.Fatalf("reply of %d bytes, %d tokens at %g; want %d bytes", len(reply), tok.Count(reply), d, tok.Cut(32))
			}
			// The next turn re-sends the prompt and the reply: the engine
			// has all of the first prompt's full blocks and the reply's.
			msgs2 := append(msgs, engine.Message{Role: "assistant", Content: reply}, engine.Message{Role: "user", Content: tok.SyntheticText(3, 20)})
			var r2 usage
			st, b = postJSON(t, s.URL()+"/v1/chat/completions", body(msgs2), nil)
			if err := json.Unmarshal(b, &r2); st != 200 || err != nil {
				t.Fatalf("chat 2: %d %s", st, b)
			}
			if n := len(tok.RenderChat(nil, nil, msgs2, true)); r2.Usage.Prompt != n {
				t.Fatalf("turn 2 prompt %d, want %d", r2.Usage.Prompt, n)
			}
			bs := s.Options().Engine.BlockSize
			if lo := (len(want) - 1) / bs * bs; r2.Usage.Details.Cached < lo {
				t.Fatalf("turn 2 cached %d, want at least the first prompt's %d", r2.Usage.Details.Cached, lo)
			}
		})
	}
}

func TestDensityValidate(t *testing.T) {
	for _, d := range []float64{0.5, -2, 100} {
		o := Options{Density: d}
		o.setDefaults()
		if err := o.validate(); err == nil {
			t.Errorf("density %g accepted", d)
		}
	}
	o := Options{Density: 2.5}
	o.setDefaults()
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
}
