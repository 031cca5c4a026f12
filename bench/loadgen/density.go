package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/bench/workload"
)

// Overhead models the tokens a chat template adds around a trace's prompt
// tokens: Fixed per request plus PerMessage for every message.
type Overhead struct {
	Fixed      float64 `json:"fixed"`
	PerMessage float64 `json:"per_message"`
	// Calibrated reports that a /tokenize preflight measured it.
	Calibrated bool `json:"calibrated"`
}

// expect is the prompt_tokens the server should report for a request of
// want trace tokens in messages messages.
func (o Overhead) expect(want, messages int) float64 {
	return float64(want) + o.Fixed + o.PerMessage*float64(messages)
}

type densitySample struct {
	want, got, messages int
}

// Density compares server-reported prompt tokens with the trace's, over
// completed requests. Drift is (got - expected) / expected per request.
type Density struct {
	Samples int `json:"samples"`
	// MedianDrift is the signed median drift; P95AbsDrift the 95th
	// percentile of its absolute value.
	MedianDrift float64  `json:"median_drift"`
	P95AbsDrift float64  `json:"p95_abs_drift"`
	Overhead    Overhead `json:"overhead"`
}

func (d Density) String() string {
	if d.Samples == 0 {
		return "no samples"
	}
	cal := "not calibrated"
	if d.Overhead.Calibrated {
		cal = fmt.Sprintf("template overhead %.1f + %.1f/message from /tokenize", d.Overhead.Fixed, d.Overhead.PerMessage)
	}
	return fmt.Sprintf("median drift %+.2f%%, p95 |drift| %.2f%% over %d requests (%s)",
		100*d.MedianDrift, 100*d.P95AbsDrift, d.Samples, cal)
}

func measureDensity(samples []densitySample, o Overhead) Density {
	d := Density{Samples: len(samples), Overhead: o}
	if len(samples) == 0 {
		return d
	}
	drift := make([]float64, len(samples))
	abs := make([]float64, len(samples))
	for i, s := range samples {
		exp := o.expect(s.want, s.messages)
		drift[i] = (float64(s.got) - exp) / max(exp, 1)
		abs[i] = math.Abs(drift[i])
	}
	slices.Sort(drift)
	slices.Sort(abs)
	d.MedianDrift = nan0(quantile(drift, 0.5))
	d.P95AbsDrift = nan0(quantile(abs, 0.95))
	return d
}

// Gate is the token-density gate: a replay whose prompts the server
// counted too differently from the trace did not send the intended shape.
type Gate struct {
	// MaxMedianDrift bounds |median drift|; default 0.05.
	MaxMedianDrift float64
	// MaxP95Drift bounds the 95th percentile of |drift|; default 0.15.
	MaxP95Drift float64
	// MinSamples is the fewest completed requests with usage the gate
	// needs to judge; default 1.
	MinSamples int
}

func (g *Gate) setDefaults() {
	if g.MaxMedianDrift <= 0 {
		g.MaxMedianDrift = 0.05
	}
	if g.MaxP95Drift <= 0 {
		g.MaxP95Drift = 0.15
	}
	if g.MinSamples <= 0 {
		g.MinSamples = 1
	}
}

// Check returns an error saying why d fails the gate, nil when it passes.
func (g Gate) Check(d Density) error {
	g.setDefaults()
	switch {
	case d.Samples < g.MinSamples:
		return fmt.Errorf("density gate: %d requests reported prompt_tokens, need at least %d", d.Samples, g.MinSamples)
	case math.Abs(d.MedianDrift) > g.MaxMedianDrift:
		return fmt.Errorf("density gate: median prompt-token drift %+.1f%% exceeds ±%.1f%%: the server counted prompts differently from the trace (tokenizer density or chat template); calibrate with -tokenize or fix the synthesis",
			100*d.MedianDrift, 100*g.MaxMedianDrift)
	case d.P95AbsDrift > g.MaxP95Drift:
		return fmt.Errorf("density gate: p95 prompt-token drift %.1f%% exceeds %.1f%%: some prompts were not sent with the intended shape",
			100*d.P95AbsDrift, 100*g.MaxP95Drift)
	}
	return nil
}

// maxPreflight bounds the /tokenize preflight.
const (
	maxPreflight        = 8
	preflightTimeout    = 10 * time.Second
	maxTokenizeResponse = 16 << 20
)

// Calibrate measures the chat-template overhead with a bounded /tokenize
// preflight (vLLM and SGLang's POST /tokenize with messages and
// add_generation_prompt): it renders up to 8 requests of t (the first
// turns, with the synthetic stand-in as history), asks the server to count
// their tokens, and fits Fixed + PerMessage*messages to the difference
// from the trace by least squares. serverURL is the server root (without
// /v1).
func Calibrate(ctx context.Context, hc *http.Client, serverURL, model string, s Synthesizer, t workload.Trace) (Overhead, error) {
	s.History = HistorySynthetic
	picks := pickCalibration(t, maxPreflight)
	hist := make(map[int][]workload.Request)
	for _, q := range t {
		hist[q.Session] = append(hist[q.Session], q)
	}
	var xs, ys []float64
	for _, id := range picks {
		q := t[id]
		msgs, err := s.Messages(hist[q.Session][:q.Turn], nil, q)
		if err != nil {
			return Overhead{}, fmt.Errorf("calibrate: %w", err)
		}
		n, err := tokenizeCount(ctx, hc, serverURL, model, msgs)
		if err != nil {
			return Overhead{}, fmt.Errorf("calibrate: %w", err)
		}
		xs = append(xs, float64(len(msgs)))
		ys = append(ys, float64(n-q.Input))
	}
	if len(xs) == 0 {
		return Overhead{}, fmt.Errorf("calibrate: empty trace")
	}
	a, b := fitLine(xs, ys)
	return Overhead{Fixed: a, PerMessage: b, Calibrated: true}, nil
}

// pickCalibration picks up to n rows with as many distinct message counts
// (turns) as possible, smallest prompts first.
func pickCalibration(t workload.Trace, n int) []int {
	byTurn := make(map[int]int) // turn -> smallest row id
	for _, q := range t {
		if cur, ok := byTurn[q.Turn]; !ok || q.Input < t[cur].Input {
			byTurn[q.Turn] = q.ID
		}
	}
	turns := make([]int, 0, len(byTurn))
	for k := range byTurn {
		turns = append(turns, k)
	}
	slices.Sort(turns)
	var ids []int
	for _, k := range turns {
		if len(ids) == n {
			break
		}
		ids = append(ids, byTurn[k])
	}
	return ids
}

// fitLine is the least-squares fit y = a + b x; b is 0 when x is constant.
func fitLine(xs, ys []float64) (a, b float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	den := n*sxx - sx*sx
	if math.Abs(den) < 1e-9 {
		return sy / n, 0
	}
	b = (n*sxy - sx*sy) / den
	return (sy - b*sx) / n, b
}

// tokenizeCount asks the server how many tokens msgs render to.
func tokenizeCount(ctx context.Context, hc *http.Client, serverURL, model string, msgs []Message) (int, error) {
	body, err := json.Marshal(map[string]any{
		"model": model, "messages": msgs, "add_generation_prompt": true,
	})
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	url := strings.TrimSuffix(serverURL, "/") + "/tokenize"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("tokenize: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeResponse))
	if err != nil {
		return 0, fmt.Errorf("tokenize: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("tokenize: status %d: %s", resp.StatusCode, truncate(string(data), 200))
	}
	var out struct {
		Count  *int  `json:"count"`
		Tokens []int `json:"tokens"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return 0, fmt.Errorf("tokenize: %w", err)
	}
	if out.Count != nil {
		return *out.Count, nil
	}
	if out.Tokens != nil {
		return len(out.Tokens), nil
	}
	return 0, fmt.Errorf("tokenize: response has neither count nor tokens")
}
