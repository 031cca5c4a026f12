package loadgen

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

func TestPieceWordsAreFourBytes(t *testing.T) {
	if len(pieceWords) < 200 {
		t.Fatalf("only %d piece words", len(pieceWords))
	}
	seen := make(map[string]bool)
	for _, w := range pieceWords {
		if len(w)+1 != pieceLen {
			t.Errorf("piece %q is %d bytes with its space, want %d", w, len(w)+1, pieceLen)
		}
		if seen[w] {
			t.Errorf("piece %q repeated", w)
		}
		seen[w] = true
	}
}

// history returns, for every row of tr, the session's earlier rows.
func history(tr workload.Trace) [][]workload.Request {
	out := make([][]workload.Request, len(tr))
	sess := make(map[int][]workload.Request)
	for i, q := range tr {
		out[i] = sess[q.Session][:q.Turn:q.Turn]
		sess[q.Session] = append(sess[q.Session], q)
	}
	return out
}

func genTrace(t *testing.T, name string, scale float64) workload.Trace {
	t.Helper()
	w, err := workload.Generate(name, workload.Options{Seed: 7, Scale: scale})
	if err != nil {
		t.Fatal(err)
	}
	return w.Trace
}

func TestSynthesisIsDeterministic(t *testing.T) {
	tr := genTrace(t, "locality", 1)
	hist := history(tr)
	c, err := NewClient(ClientConfig{BaseURL: "http://127.0.0.1:1/v1"})
	if err != nil {
		t.Fatal(err)
	}
	body := func(s Synthesizer, i int) []byte {
		msgs, err := s.Messages(hist[i], nil, tr[i])
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(c.Params(msgs, tr[i].Output))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	s := Synthesizer{Synth: workload.Synth{Salt: 1}, History: HistorySynthetic}
	for i := range tr {
		a, b := body(s, i), body(s, i)
		if string(a) != string(b) {
			t.Fatalf("row %d: two renderings differ", i)
		}
	}
	// A different salt gives different bytes.
	other := Synthesizer{Synth: workload.Synth{Salt: 2}, History: HistorySynthetic}
	if string(body(s, 0)) == string(body(other, 0)) {
		t.Fatal("salts 1 and 2 rendered the same request")
	}
}

func TestSynthesisSharesPrefixes(t *testing.T) {
	tr := genTrace(t, "locality", 1)
	hist := history(tr)
	s := Synthesizer{Synth: workload.Synth{Salt: 3}, History: HistorySynthetic}
	render := func(i int) []Message {
		msgs, err := s.Messages(hist[i], nil, tr[i])
		if err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	byGroup := make(map[int]string)
	for i, q := range tr {
		msgs := render(i)
		if msgs[0].Role != "system" || len(msgs[0].Content) != pieceLen*q.Prefix {
			t.Fatalf("row %d: first message %s of %d bytes, want system of %d", i, msgs[0].Role, len(msgs[0].Content), pieceLen*q.Prefix)
		}
		if prev, ok := byGroup[q.Group]; ok && prev != msgs[0].Content {
			t.Fatalf("row %d: group %d system prompt differs from the group's first", i, q.Group)
		}
		byGroup[q.Group] = msgs[0].Content
		if q.Turn > 0 {
			// Turn N+1 begins with turn N's messages and its reply.
			prev := render(hist[i][q.Turn-1].ID)
			if diff := cmp.Diff(prev, msgs[:len(prev)]); diff != "" {
				t.Fatalf("row %d: turn %d does not extend turn %d (-want +got):\n%s", i, q.Turn, q.Turn-1, diff)
			}
			reply := msgs[len(prev)]
			if reply.Role != "assistant" || len(reply.Content) != pieceLen*hist[i][q.Turn-1].Output {
				t.Fatalf("row %d: message after the previous turn is %s of %d bytes", i, reply.Role, len(reply.Content))
			}
		}
	}
	if len(byGroup) != 8 || byGroup[0] == byGroup[1] {
		t.Fatalf("want 8 distinct group prompts, got %d", len(byGroup))
	}
}

func TestSynthesisActualReplies(t *testing.T) {
	tr := genTrace(t, "locality", 1)
	hist := history(tr)
	s := Synthesizer{Synth: workload.Synth{Salt: 3}, History: HistoryActual}
	for i, q := range tr {
		if q.Turn != 1 {
			continue
		}
		msgs, err := s.Messages(hist[i], []string{"the engine said this"}, q)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range msgs {
			if m.Role == "assistant" {
				got = append(got, m.Content)
			}
		}
		if diff := cmp.Diff([]string{"the engine said this"}, got); diff != "" {
			t.Fatalf("assistant messages (-want +got):\n%s", diff)
		}
		// Without a reply the stand-in is used.
		msgs, err = s.Messages(hist[i], nil, q)
		if err != nil {
			t.Fatal(err)
		}
		if msgs[2].Role != "assistant" || len(msgs[2].Content) != pieceLen*hist[i][0].Output {
			t.Fatalf("stand-in reply: %s of %d bytes", msgs[2].Role, len(msgs[2].Content))
		}
		return
	}
	t.Fatal("no second turn in the trace")
}

// TestSynthesisTokenCounts checks the rendered prompts against the engine
// simulator's tokenizer and chat template: the body tokens equal the
// trace's input exactly, and the template adds a fixed overhead per
// message.
func TestSynthesisTokenCounts(t *testing.T) {
	for _, name := range []string{"locality", "burst", "agent-fleet"} {
		t.Run(name, func(t *testing.T) {
			tr := genTrace(t, name, 0.1)
			hist := history(tr)
			s := Synthesizer{Synth: workload.Synth{Salt: 9}, History: HistorySynthetic}
			for i, q := range tr {
				msgs, err := s.Messages(hist[i], nil, q)
				if err != nil {
					t.Fatal(err)
				}
				body := 0
				em := make([]engine.Message, len(msgs))
				for k, m := range msgs {
					body += engine.CountTextTokens(m.Content)
					em[k] = engine.Message{Role: m.Role, Content: m.Content}
				}
				if body != q.Input {
					t.Fatalf("row %d: %d body tokens, trace asks %d", i, body, q.Input)
				}
				got := len(engine.RenderChat(nil, nil, em, true))
				// ChatML: <|im_start|> role\n body <|im_end|> \n per message,
				// then <|im_start|> assistant\n: 5-6 tokens a message + 4.
				over := got - q.Input
				if over < 5*len(msgs)+4 || over > 6*len(msgs)+4 {
					t.Fatalf("row %d: template overhead %d tokens for %d messages", i, over, len(msgs))
				}
				if d := float64(over) / float64(q.Input); d > 0.02 {
					t.Fatalf("row %d: overhead %.1f%% of the prompt", i, 100*d)
				}
			}
		})
	}
}

func TestAppendTextEmptyAndWords(t *testing.T) {
	if got := AppendText(nil, nil); len(got) != 0 {
		t.Fatalf("empty ids gave %q", got)
	}
	got := string(AppendText(nil, []uint32{0, 1, uint32(len(pieceWords))}))
	if want := " the and the"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if strings.ContainsAny(got, "\n\t\"\\") {
		t.Fatal("text needs escaping")
	}
}

// TestSynthesisDensity renders the traces for engines of other densities:
// every message is exactly its segment's tokens to the engine's tokenizer,
// and an id sequence's prefix renders to a byte prefix that the engine
// tokenizes to the same first tokens (a block shared by two rows of a
// hash-id trace is the same tokens to the engine).
func TestSynthesisDensity(t *testing.T) {
	tr := genTrace(t, "agent-fleet", 0.1)
	hist := history(tr)
	for _, d := range []float64{2.5, 3.3, 4.2, 5} {
		tok := engine.Tokenizer{Density: d}
		s := Synthesizer{Synth: workload.Synth{Salt: 9}, History: HistorySynthetic, Tokenizer: tok}
		for i, q := range tr[:min(len(tr), 200)] {
			msgs, err := s.Messages(hist[i], nil, q)
			if err != nil {
				t.Fatal(err)
			}
			body, nb := 0, 0
			for _, m := range msgs {
				body += tok.Count(m.Content)
				nb += len(m.Content)
			}
			if body != q.Input {
				t.Fatalf("D=%g row %d: %d body tokens, trace asks %d", d, i, body, q.Input)
			}
			if lo, hi := float64(q.Input)*d-float64(len(msgs)), float64(q.Input)*d+float64(len(msgs)); float64(nb) < lo || float64(nb) > hi {
				t.Fatalf("D=%g row %d: %d bytes for %d tokens", d, i, nb, q.Input)
			}
		}
		ids := workload.Synth{Salt: 3}.BlockTokens(nil, 7, 300)
		full := AppendTextAt(nil, ids, tok)
		want := tok.Text(nil, string(full))
		if len(want) != len(ids) {
			t.Fatalf("D=%g: %d ids rendered as %d tokens", d, len(ids), len(want))
		}
		for _, k := range []int{1, 16, 17, 150, 299} {
			pre := AppendTextAt(nil, ids[:k], tok)
			if !bytes.HasPrefix(full, pre) || !slices.Equal(tok.Text(nil, string(pre)), want[:k]) {
				t.Fatalf("D=%g: the first %d ids are not the text's first %d tokens", d, k, k)
			}
		}
		other := slices.Clone(ids)
		other[200]++
		if o := tok.Text(nil, string(AppendTextAt(nil, other, tok))); !slices.Equal(o[:200], want[:200]) || slices.Equal(o, want) {
			t.Fatalf("D=%g: a different id at 200 changed the wrong tokens", d)
		}
	}
	// Density 4 is AppendText's text.
	ids := workload.Synth{Salt: 1}.BlockTokens(nil, 1, 64)
	if !bytes.Equal(AppendTextAt(nil, ids, engine.Tokenizer{Density: 4}), AppendText(nil, ids)) {
		t.Fatal("density 4 differs from AppendText")
	}
}
