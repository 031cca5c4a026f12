package loadgen

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ramjet-llm/ramjet/bench/workload"
)

// maxUpstreams bounds the distinct upstream ids a report keeps; the rest
// are counted under "(other)".
const maxUpstreams = 1024

// Report is the summary of one replay.
type Report struct {
	Label string `json:"label,omitempty"`
	Model string `json:"model"`
	// Requests is the trace length; Sent + NotSent == Requests and
	// Completed + Failed == Sent.
	Requests  int `json:"requests"`
	Sent      int `json:"sent"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	NotSent   int `json:"not_sent"`
	// Interrupted says why the run stopped early, empty when it ran to
	// the end.
	Interrupted string `json:"interrupted,omitempty"`
	// Errors counts failed requests by kind.
	Errors map[ErrorKind]int `json:"errors"`
	// ErrorSamples are the first few error messages.
	ErrorSamples []string `json:"error_samples,omitempty"`
	// Seconds is the wall time of the run.
	Seconds float64 `json:"seconds"`
	// TTFT, ITL (gap between output chunks), E2E and QueueDelay (send time
	// minus trace time) over completed requests.
	TTFT       Dist `json:"ttft"`
	ITL        Dist `json:"itl"`
	E2E        Dist `json:"e2e"`
	QueueDelay Dist `json:"queue_delay"`
	// Token totals from the server's usage, over completed requests.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// CachedShare is CachedTokens / PromptTokens.
	CachedShare float64 `json:"cached_share"`
	// Makespan is the time from the first send to the last completion,
	// in seconds.
	Makespan float64 `json:"makespan_seconds"`
	// OutputTokensPerSec and RequestsPerSec are over the makespan.
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	RequestsPerSec     float64 `json:"requests_per_sec"`
	// Upstreams counts completed requests per upstream header value
	// ("(none)" when the header was absent).
	Upstreams map[string]int `json:"upstreams"`
	// Spread is the busiest upstream's share of completed requests over
	// the mean share (1 = perfectly even), across the upstreams seen.
	Spread float64 `json:"spread"`
	// Density compares the prompt tokens the server counted with the
	// trace's.
	Density Density `json:"density"`
}

// aggregator folds results into a Report. add runs on the run's collector
// goroutine; the counters read by the progress bar are atomic.
type aggregator struct {
	label, model string
	trace        workload.Trace
	start, end   time.Time

	sent        int
	completedN  atomic.Int64
	failedN     atomic.Int64
	notSent     int
	interrupted string

	first, last time.Duration // first send, last completion (completed requests)
	errors      map[ErrorKind]int
	samples     []string
	ttft, e2e   durations
	queue       durations
	itl         Histogram
	prompt      int64
	cached      int64
	output      atomic.Int64
	upstreams   map[string]int
	density     []densitySample
	overhead    Overhead
}

func newAggregator(label string, t workload.Trace, model string) *aggregator {
	return &aggregator{
		label: label, model: model, trace: t,
		errors:    make(map[ErrorKind]int),
		upstreams: make(map[string]int),
	}
}

func (a *aggregator) add(r *Result) {
	a.queue.add(max(0, r.Sent-r.Scheduled))
	if !r.OK() {
		a.failedN.Add(1)
		a.errors[r.Err]++
		if len(a.samples) < 5 {
			a.samples = append(a.samples, fmt.Sprintf("request %d (%s): %s", r.Index, r.Err, r.ErrMsg))
		}
		r.itl = nil
		return
	}
	if a.completedN.Add(1) == 1 || r.Sent < a.first {
		a.first = r.Sent
	}
	a.last = max(a.last, r.Sent+r.E2E)
	a.ttft.add(r.TTFT)
	a.e2e.add(r.E2E)
	for _, d := range r.itl {
		a.itl.Record(d)
	}
	r.itl = nil
	a.prompt += int64(r.PromptTokens)
	a.cached += int64(r.CachedTokens)
	a.output.Add(int64(r.OutputTokens))
	up := r.Upstream
	if up == "" {
		up = "(none)"
	}
	if _, ok := a.upstreams[up]; !ok && len(a.upstreams) >= maxUpstreams {
		up = "(other)"
	}
	a.upstreams[up]++
	a.density = append(a.density, densitySample{want: r.WantPrompt, got: r.PromptTokens, messages: r.messages})
}

func (a *aggregator) report() *Report {
	secs := a.end.Sub(a.start).Seconds()
	rep := &Report{
		Label: a.label, Model: a.model,
		Requests: len(a.trace), Sent: a.sent,
		Completed: int(a.completedN.Load()), Failed: int(a.failedN.Load()),
		NotSent: a.notSent, Interrupted: a.interrupted,
		Errors: a.errors, ErrorSamples: a.samples,
		Seconds: secs,
		TTFT:    distOf(&a.ttft), ITL: distOfHist(&a.itl), E2E: distOf(&a.e2e),
		QueueDelay:   distOf(&a.queue),
		PromptTokens: a.prompt, CachedTokens: a.cached, OutputTokens: a.output.Load(),
		Upstreams: a.upstreams,
	}
	if a.prompt > 0 {
		rep.CachedShare = float64(a.cached) / float64(a.prompt)
	}
	if mk := (a.last - a.first).Seconds(); mk > 0 {
		rep.Makespan = mk
		rep.OutputTokensPerSec = float64(rep.OutputTokens) / mk
		rep.RequestsPerSec = float64(rep.Completed) / mk
	}
	rep.Spread = rep.SpreadOver(0)
	rep.Density = measureDensity(a.density, a.overhead)
	return rep
}

// SpreadOver is the busiest upstream's completed requests over the mean
// per replica of a fleet of n replicas (1 = even; n when one replica took
// everything), the fleet simulation's max/mean load. n <= 0 means the
// number of upstreams seen. It is 0 without completed requests.
func (r *Report) SpreadOver(n int) float64 {
	if n <= 0 {
		n = len(r.Upstreams)
	}
	total, most := 0, 0
	for _, c := range r.Upstreams {
		total += c
		most = max(most, c)
	}
	if total == 0 || n == 0 {
		return 0
	}
	return float64(most) / (float64(total) / float64(n))
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as aligned text.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if r.Label != "" {
		fmt.Fprintf(tw, "run\t%s\n", r.Label)
	}
	fmt.Fprintf(tw, "requests\t%d sent, %d completed, %d failed, %d not sent (of %d)\n",
		r.Sent, r.Completed, r.Failed, r.NotSent, r.Requests)
	if r.Interrupted != "" {
		fmt.Fprintf(tw, "interrupted\t%s\n", r.Interrupted)
	}
	fmt.Fprintf(tw, "wall time\t%.2f s (makespan %.2f s)\n", r.Seconds, r.Makespan)
	fmt.Fprintf(tw, "throughput\t%.1f output tok/s, %.2f req/s\n", r.OutputTokensPerSec, r.RequestsPerSec)
	fmt.Fprintf(tw, "cached prompt share\t%.1f%% (%d of %d prompt tokens)\n", 100*r.CachedShare, r.CachedTokens, r.PromptTokens)
	fmt.Fprintf(tw, "\t\tmean\tp50\tp90\tp95\tp99\tmax\n")
	for _, d := range []struct {
		name string
		d    Dist
	}{{"TTFT ms", r.TTFT}, {"ITL ms", r.ITL}, {"E2E ms", r.E2E}, {"queue delay ms", r.QueueDelay}} {
		fmt.Fprintf(tw, "%s\t\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\n", d.name, d.d.Mean, d.d.P50, d.d.P90, d.d.P95, d.d.P99, d.d.Max)
	}
	fmt.Fprintf(tw, "upstreams\t%s\n", formatUpstreams(r.Upstreams))
	fmt.Fprintf(tw, "spread (max/mean)\t%.2f\n", r.Spread)
	fmt.Fprintf(tw, "prompt density\t%s\n", r.Density.String())
	if len(r.Errors) > 0 {
		kinds := make([]string, 0, len(r.Errors))
		for k, n := range r.Errors {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, n))
		}
		slices.Sort(kinds)
		fmt.Fprintf(tw, "errors\t%s\n", strings.Join(kinds, " "))
		for _, s := range r.ErrorSamples {
			fmt.Fprintf(tw, "\t%s\n", s)
		}
	}
	return tw.Flush()
}

func formatUpstreams(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	all := make([]kv, 0, len(m))
	for k, v := range m {
		all = append(all, kv{k, v})
	}
	slices.SortFunc(all, func(a, b kv) int { return cmp.Or(cmp.Compare(b.v, a.v), cmp.Compare(a.k, b.k)) })
	parts := make([]string, 0, min(len(all), 16))
	for i, e := range all {
		if i == 16 {
			parts = append(parts, fmt.Sprintf("... %d more", len(all)-16))
			break
		}
		parts = append(parts, fmt.Sprintf("%s=%d", e.k, e.v))
	}
	return strings.Join(parts, " ")
}

// nan0 maps NaN to 0 for JSON.
func nan0(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}
