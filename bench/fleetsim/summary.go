package fleetsim

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/ramjet-llm/ramjet/bench/stats"
)

// Summary is one table row: a policy's figures on one workload.
type Summary struct {
	Policy   string `json:"policy"`
	Workload string `json:"workload"`
	Replicas int    `json:"replicas"`
	Requests int    `json:"requests"`
	Failed   int    `json:"failed"`
	// CachedShare is cached prompt tokens / prompt tokens.
	CachedShare float64 `json:"cached_share"`
	// TTFT percentiles, seconds (stats.Percentile).
	TTFTp50 float64 `json:"ttft_p50_s"`
	TTFTp95 float64 `json:"ttft_p95_s"`
	TTFTp99 float64 `json:"ttft_p99_s"`
	// OutputTPS is output tokens over the makespan (first send to last
	// completion), tokens per second.
	OutputTPS float64 `json:"output_tokens_per_s"`
	Makespan  float64 `json:"makespan_s"`
	// ReplicasUsed counts replicas that served at least one request.
	ReplicasUsed int `json:"replicas_used"`
	// MaxMeanLoad is the busiest replica's request count over the mean.
	MaxMeanLoad float64 `json:"max_mean_load"`
	// Ratios against the best peer (ramjet rows only; 0 elsewhere):
	// share and throughput ratio > 1 and TTFT ratio < 1 favour ramjet.
	VsBest *Ratios `json:"vs_best_peer,omitempty"`
	// WallSeconds is the simulation's own run time.
	WallSeconds float64 `json:"wall_s"`

	ttfts []float64
}

// Ratios compare one row with the best peer per metric.
type Ratios struct {
	CachedShare float64 `json:"cached_share"`
	TTFTp50     float64 `json:"ttft_p50"`
	TTFTp95     float64 `json:"ttft_p95"`
	TTFTp99     float64 `json:"ttft_p99"`
	OutputTPS   float64 `json:"output_tokens_per_s"`
	// Best names the best peer per metric.
	Best map[string]string `json:"best"`
}

// Summarize computes a result's row.
func Summarize(r *Result) Summary {
	s := Summary{Policy: r.Policy, Workload: r.Workload, Replicas: r.Replicas, WallSeconds: r.Wall.Seconds()}
	var prompt, cached, out int64
	first, last := math.Inf(1), math.Inf(-1)
	for _, rec := range r.Records {
		s.Requests++
		first = math.Min(first, rec.Sent)
		last = math.Max(last, rec.Done)
		if rec.Err != "" {
			s.Failed++
			continue
		}
		prompt += int64(rec.Prompt)
		cached += int64(rec.Cached)
		out += int64(rec.Output)
		s.ttfts = append(s.ttfts, rec.TTFT())
	}
	slices.Sort(s.ttfts)
	if prompt > 0 {
		s.CachedShare = float64(cached) / float64(prompt)
	}
	s.TTFTp50 = stats.Percentile(s.ttfts, 50)
	s.TTFTp95 = stats.Percentile(s.ttfts, 95)
	s.TTFTp99 = stats.Percentile(s.ttfts, 99)
	if last > first {
		s.Makespan = last - first
		s.OutputTPS = float64(out) / s.Makespan
	}
	total, most := 0, 0
	for _, n := range r.Routed {
		if n > 0 {
			s.ReplicasUsed++
		}
		total += n
		most = max(most, n)
	}
	if total > 0 {
		s.MaxMeanLoad = float64(most) / (float64(total) / float64(len(r.Routed)))
	}
	return s
}

// TTFTs returns the row's sorted TTFT samples (seconds).
func (s *Summary) TTFTs() []float64 { return s.ttfts }

// CompareToPeers fills VsBest on the ramjet rows of one workload's rows.
func CompareToPeers(rows []Summary) {
	var peers []Summary
	for _, r := range rows {
		if !isRamjet(r.Policy) && r.Policy != Oracle {
			peers = append(peers, r)
		}
	}
	if len(peers) == 0 {
		return
	}
	bestBy := func(get func(Summary) float64, higher bool) (float64, string) {
		b, name := get(peers[0]), peers[0].Policy
		for _, p := range peers[1:] {
			v := get(p)
			if (higher && v > b) || (!higher && v < b) {
				b, name = v, p.Policy
			}
		}
		return b, name
	}
	ratio := func(a, b float64) float64 {
		if b == 0 {
			if a == 0 {
				return 1
			}
			return math.Inf(1)
		}
		return a / b
	}
	for i := range rows {
		if !isRamjet(rows[i].Policy) {
			continue
		}
		r := rows[i]
		v := &Ratios{Best: map[string]string{}}
		var b float64
		b, v.Best["cached_share"] = bestBy(func(s Summary) float64 { return s.CachedShare }, true)
		v.CachedShare = ratio(r.CachedShare, b)
		b, v.Best["ttft_p50"] = bestBy(func(s Summary) float64 { return s.TTFTp50 }, false)
		v.TTFTp50 = ratio(r.TTFTp50, b)
		b, v.Best["ttft_p95"] = bestBy(func(s Summary) float64 { return s.TTFTp95 }, false)
		v.TTFTp95 = ratio(r.TTFTp95, b)
		b, v.Best["ttft_p99"] = bestBy(func(s Summary) float64 { return s.TTFTp99 }, false)
		v.TTFTp99 = ratio(r.TTFTp99, b)
		b, v.Best["output_tokens_per_s"] = bestBy(func(s Summary) float64 { return s.OutputTPS }, true)
		v.OutputTPS = ratio(r.OutputTPS, b)
		rows[i].VsBest = v
	}
}

func isRamjet(name string) bool { return strings.HasPrefix(name, "ramjet") }

// WriteTable writes one workload's rows as a markdown table, then the
// ramjet-versus-best-peer line.
func WriteTable(w io.Writer, title string, rows []Summary) {
	fmt.Fprintf(w, "### %s\n\n", title)
	fmt.Fprintln(w, "| policy | cached share | TTFT p50 (s) | TTFT p95 (s) | TTFT p99 (s) | output tok/s | replicas used | max/mean load | failed |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		if r.Policy == Oracle {
			fmt.Fprintf(w, "| %s (infinite cache) | %.3f | | | | | | | |\n", r.Policy, r.CachedShare)
			continue
		}
		fmt.Fprintf(w, "| %s | %.3f | %.3f | %.3f | %.3f | %.0f | %d/%d | %.2f | %d |\n",
			r.Policy, r.CachedShare, r.TTFTp50, r.TTFTp95, r.TTFTp99, r.OutputTPS,
			r.ReplicasUsed, r.Replicas, r.MaxMeanLoad, r.Failed)
	}
	for _, r := range rows {
		if v := r.VsBest; v != nil {
			fmt.Fprintf(w, "\n%s vs best peer: cached share x%.2f (%s), TTFT p50 x%.2f (%s), p95 x%.2f (%s), p99 x%.2f (%s), output tok/s x%.2f (%s)\n",
				r.Policy, v.CachedShare, v.Best["cached_share"], v.TTFTp50, v.Best["ttft_p50"],
				v.TTFTp95, v.Best["ttft_p95"], v.TTFTp99, v.Best["ttft_p99"], v.OutputTPS, v.Best["output_tokens_per_s"])
		}
	}
	fmt.Fprintln(w)
}
