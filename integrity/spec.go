package integrity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The vLLM speculative-decoding counters.
const (
	MetricDraftTokens    = "vllm:spec_decode_num_draft_tokens_total"
	MetricAcceptedTokens = "vllm:spec_decode_num_accepted_tokens_total"
	MetricAcceptedPerPos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
)

// MaxPositions bounds the draft positions a SpecCounters holds.
const MaxPositions = 16

// SpecCounters are one scrape of an engine's cumulative spec-decode
// counters (for one data-parallel rank, or summed over all of them).
type SpecCounters struct {
	DraftTokens    float64
	AcceptedTokens float64
	// AcceptedPerPos[p] is the accepted tokens at draft position p;
	// valid for p < Positions (0 when the engine exports none).
	AcceptedPerPos [MaxPositions]float64
	Positions      int
}

// Target is one replica to check: its key (the caller's name for it,
// never written anywhere), the engine's base URL, its data-parallel rank
// (-1 for none) and the headers to send (e.g. Authorization).
type Target struct {
	Key     string
	BaseURL string
	Rank    int
	Header  http.Header
}

// SpecSource reads a replica's spec-decode counters. Implementations must
// be safe for concurrent use. An error makes the window incomplete.
type SpecSource interface {
	Spec(ctx context.Context, t Target) (SpecCounters, error)
}

// maxMetricsBytes bounds one /metrics answer.
const maxMetricsBytes = 8 << 20

// MetricsSource is the SpecSource reading an engine's Prometheus text
// exposition (vLLM's /metrics). With a data-parallel rank it sums the
// samples whose "engine" label is the rank, else every sample.
type MetricsSource struct {
	Client *http.Client
	// Path is the metrics path. Default "/metrics".
	Path string
	// Timeout bounds one scrape. Default 2s.
	Timeout time.Duration
}

var _ SpecSource = (*MetricsSource)(nil)

// Spec implements SpecSource.
func (s *MetricsSource) Spec(ctx context.Context, t Target) (SpecCounters, error) {
	path, timeout, client := s.Path, s.Timeout, s.Client
	if path == "" {
		path = "/metrics"
	}
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(t.BaseURL, "/")+path, nil)
	if err != nil {
		return SpecCounters{}, err
	}
	for k, v := range t.Header {
		req.Header[k] = v
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := client.Do(req)
	if err != nil {
		return SpecCounters{}, fmt.Errorf("scraping metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return SpecCounters{}, fmt.Errorf("scraping metrics: status %d", resp.StatusCode)
	}
	return ParseSpec(io.LimitReader(resp.Body, maxMetricsBytes), t.Rank)
}

// ParseSpec reads the spec-decode counters from a Prometheus text
// exposition, for rank (-1: summed over every "engine" label value). It is
// an error when the draft or accepted counter is missing.
func ParseSpec(r io.Reader, rank int) (SpecCounters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return SpecCounters{}, fmt.Errorf("parsing metrics: %w", err)
	}
	var c SpecCounters
	var ok bool
	if c.DraftTokens, ok = sumFamily(fams, MetricDraftTokens, rank, nil); !ok {
		return SpecCounters{}, errors.New("no " + MetricDraftTokens + " counter")
	}
	if c.AcceptedTokens, ok = sumFamily(fams, MetricAcceptedTokens, rank, nil); !ok {
		return SpecCounters{}, errors.New("no " + MetricAcceptedTokens + " counter")
	}
	sumFamily(fams, MetricAcceptedPerPos, rank, &c)
	return c, nil
}

// familyFor finds name as the text parser may have filed it: under the
// sample name, or under the name without "_total" (a counter's TYPE line
// from Python's client).
func familyFor(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if f, ok := fams[name]; ok {
		return f
	}
	return fams[strings.TrimSuffix(name, "_total")]
}

// sumFamily sums the samples of a counter for rank; with per set, it
// files each sample by its "position" label into per instead.
func sumFamily(fams map[string]*dto.MetricFamily, name string, rank int, per *SpecCounters) (float64, bool) {
	f := familyFor(fams, name)
	if f == nil {
		return 0, false
	}
	want := strconv.Itoa(rank)
	sum := 0.0
	for _, m := range f.GetMetric() {
		pos := -1
		skip := false
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "engine":
				if rank >= 0 && l.GetValue() != want {
					skip = true
				}
			case "position":
				if n, err := strconv.Atoi(l.GetValue()); err == nil {
					pos = n
				}
			}
		}
		if skip {
			continue
		}
		v := m.GetCounter().GetValue()
		if m.Counter == nil {
			v = m.GetUntyped().GetValue()
		}
		if per != nil {
			if pos >= 0 && pos < MaxPositions {
				per.AcceptedPerPos[pos] += v
				per.Positions = max(per.Positions, pos+1)
			}
			continue
		}
		sum += v
	}
	return sum, true
}

// WindowConfig shapes the acceptance-collapse detector.
type WindowConfig struct {
	// Windows is N: the consecutive complete windows with drafts but no
	// accepted token that make a collapse. Default 3.
	Windows int
	// Position is the draft position whose acceptance is watched; -1
	// watches the overall acceptance. Default -1 (set it explicitly: the
	// zero value 0 is position 0).
	Position int
}

// Window is one replica's collapse detector. It is fed the cumulative
// counters of every scrape (Observe) and breaks the chain on a failed
// scrape (Break): a window is complete only between two successful
// scrapes of the same engine instance with no counter going backwards.
// Windows without draft tokens (idle) and incomplete windows neither
// count nor reset the streak; a window with drafts and an accepted token
// resets it. Not safe for concurrent use.
type Window struct {
	cfg    WindowConfig
	prev   SpecCounters
	have   bool
	streak int
	// LastRatio is the acceptance (accepted/draft tokens, overall) of the
	// last complete window with drafts; -1 before any.
	LastRatio float64
}

// NewWindow returns a detector.
func NewWindow(cfg WindowConfig) *Window {
	if cfg.Windows <= 0 {
		cfg.Windows = 3
	}
	return &Window{cfg: cfg, LastRatio: -1}
}

// Streak is the current run of zero-acceptance windows.
func (w *Window) Streak() int { return w.streak }

// Break marks the chain broken (a failed scrape, or a new instance): the
// next Observe only starts a window.
func (w *Window) Break() { w.have = false }

// Reset breaks the chain and forgets the streak (a new instance).
func (w *Window) Reset() {
	w.have, w.streak, w.LastRatio = false, 0, -1
}

// Observe feeds one scrape and reports whether the replica has now
// collapsed (streak reached N).
func (w *Window) Observe(c SpecCounters) bool {
	prev, had := w.prev, w.have
	w.prev, w.have = c, true
	if !had {
		return false
	}
	dDraft := c.DraftTokens - prev.DraftTokens
	dAcc := c.AcceptedTokens - prev.AcceptedTokens
	if dDraft < 0 || dAcc < 0 {
		return false // counters went back: an engine restart; the window is incomplete
	}
	if dDraft == 0 {
		return w.streak >= w.cfg.Windows // idle
	}
	w.LastRatio = dAcc / dDraft
	acc := dAcc
	if p := w.cfg.Position; p >= 0 {
		if p >= c.Positions || p >= prev.Positions {
			return w.streak >= w.cfg.Windows // position not exported: incomplete
		}
		acc = c.AcceptedPerPos[p] - prev.AcceptedPerPos[p]
		if acc < 0 {
			return w.streak >= w.cfg.Windows
		}
	}
	if acc == 0 {
		w.streak++
	} else {
		w.streak = 0
	}
	return w.streak >= w.cfg.Windows
}
