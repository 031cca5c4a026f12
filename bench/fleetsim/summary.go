package fleetsim

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
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
	// OracleShare is the infinite-cache oracle's cached share on the same
	// trace (OracleShare), PooledShare the pooled-capacity oracle's (one
	// LRU of the fleet's total KV capacity, PooledOracleShare).
	OracleShare float64 `json:"oracle_cached_share"`
	PooledShare float64 `json:"pooled_oracle_cached_share"`

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
	fmt.Fprintln(w, "| policy | cached share | / oracle | / pooled | TTFT p50 (s) | TTFT p95 (s) | TTFT p99 (s) | output tok/s | replicas used | max/mean load | failed |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		if r.Policy == Oracle {
			fmt.Fprintf(w, "| %s (infinite cache) | %.3f | | | | | | | | | |\n", r.Policy, r.OracleShare)
			fmt.Fprintf(w, "| %s (pooled LRU of the fleet's KV) | %.3f | | | | | | | | | |\n", r.Policy, r.PooledShare)
			continue
		}
		fmt.Fprintf(w, "| %s | %.3f | %.2f | %.2f | %.3f | %.3f | %.3f | %.0f | %d/%d | %.2f | %d |\n",
			r.Policy, r.CachedShare, ratioOf(r.CachedShare, r.OracleShare), ratioOf(r.CachedShare, r.PooledShare),
			r.TTFTp50, r.TTFTp95, r.TTFTp99, r.OutputTPS,
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

func ratioOf(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// Spread is a figure over seeds.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// Format renders s as its median with prec decimals, followed by
// "(min-max)" when the seeds differ.
func (s Spread) Format(prec int) string {
	if s.Min == s.Max {
		return strconv.FormatFloat(s.Median, 'f', prec, 64)
	}
	return fmt.Sprintf("%s (%s-%s)", strconv.FormatFloat(s.Median, 'f', prec, 64),
		strconv.FormatFloat(s.Min, 'f', prec, 64), strconv.FormatFloat(s.Max, 'f', prec, 64))
}

func spreadOf(xs []float64) Spread {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return Spread{math.NaN(), math.NaN(), math.NaN()}
	}
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Spread{Median: m, Min: s[0], Max: s[len(s)-1]}
}

// RelSpread is (max-min)/median: the seed-to-seed spread as a fraction.
func (s Spread) RelSpread() float64 {
	if s.Median == 0 {
		return 0
	}
	return (s.Max - s.Min) / math.Abs(s.Median)
}

// SeedSummary is one policy's row over several seeds.
type SeedSummary struct {
	Policy       string  `json:"policy"`
	Workload     string  `json:"workload"`
	Replicas     int     `json:"replicas"`
	Seeds        int     `json:"seeds"`
	Requests     Spread  `json:"requests"`
	Failed       Spread  `json:"failed"`
	CachedShare  Spread  `json:"cached_share"`
	OracleShare  Spread  `json:"oracle_cached_share"`
	PooledShare  Spread  `json:"pooled_oracle_cached_share"`
	TTFTp50      Spread  `json:"ttft_p50_s"`
	TTFTp95      Spread  `json:"ttft_p95_s"`
	TTFTp99      Spread  `json:"ttft_p99_s"`
	OutputTPS    Spread  `json:"output_tokens_per_s"`
	ReplicasUsed Spread  `json:"replicas_used"`
	MaxMeanLoad  Spread  `json:"max_mean_load"`
	VsBest       *Ratios `json:"vs_best_peer,omitempty"`
}

// Aggregate turns per-seed rows (perSeed[k] is seed k's rows, the same
// policies in the same order) into one row per policy with the median,
// min and max over the seeds. VsBest compares the medians.
func Aggregate(perSeed [][]Summary) []SeedSummary {
	if len(perSeed) == 0 {
		return nil
	}
	out := make([]SeedSummary, len(perSeed[0]))
	medians := make([]Summary, len(perSeed[0]))
	for i, r0 := range perSeed[0] {
		get := func(f func(Summary) float64) Spread {
			xs := make([]float64, 0, len(perSeed))
			for _, rows := range perSeed {
				xs = append(xs, f(rows[i]))
			}
			return spreadOf(xs)
		}
		a := SeedSummary{
			Policy: r0.Policy, Workload: r0.Workload, Replicas: r0.Replicas, Seeds: len(perSeed),
			Requests:     get(func(s Summary) float64 { return float64(s.Requests) }),
			Failed:       get(func(s Summary) float64 { return float64(s.Failed) }),
			CachedShare:  get(func(s Summary) float64 { return s.CachedShare }),
			OracleShare:  get(func(s Summary) float64 { return s.OracleShare }),
			PooledShare:  get(func(s Summary) float64 { return s.PooledShare }),
			TTFTp50:      get(func(s Summary) float64 { return s.TTFTp50 }),
			TTFTp95:      get(func(s Summary) float64 { return s.TTFTp95 }),
			TTFTp99:      get(func(s Summary) float64 { return s.TTFTp99 }),
			OutputTPS:    get(func(s Summary) float64 { return s.OutputTPS }),
			ReplicasUsed: get(func(s Summary) float64 { return float64(s.ReplicasUsed) }),
			MaxMeanLoad:  get(func(s Summary) float64 { return s.MaxMeanLoad }),
		}
		out[i] = a
		medians[i] = Summary{
			Policy: a.Policy, CachedShare: a.CachedShare.Median, TTFTp50: a.TTFTp50.Median,
			TTFTp95: a.TTFTp95.Median, TTFTp99: a.TTFTp99.Median, OutputTPS: a.OutputTPS.Median,
		}
	}
	CompareToPeers(medians)
	for i := range out {
		out[i].VsBest = medians[i].VsBest
	}
	return out
}

// WriteSeedTable writes one workload's rows over seeds as a markdown
// table (each cell the median, with min-max below it), then the ramjet
// versus best peer line on the medians.
func WriteSeedTable(w io.Writer, title string, rows []SeedSummary) {
	fmt.Fprintf(w, "### %s\n\n", title)
	fmt.Fprintln(w, "Median over seeds (min-max).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| policy | cached share | / oracle | / pooled | TTFT p50 (s) | TTFT p95 (s) | TTFT p99 (s) | output tok/s | replicas used | max/mean load | failed |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	f := Spread.Format
	for _, r := range rows {
		if r.Policy == Oracle {
			fmt.Fprintf(w, "| %s (infinite cache) | %s | | | | | | | | | |\n", r.Policy, f(r.OracleShare, 3))
			fmt.Fprintf(w, "| %s (pooled LRU of the fleet's KV) | %s | | | | | | | | | |\n", r.Policy, f(r.PooledShare, 3))
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %.2f | %.2f | %s | %s | %s | %s | %s/%d | %s | %s |\n",
			r.Policy, f(r.CachedShare, 3), ratioOf(r.CachedShare.Median, r.OracleShare.Median),
			ratioOf(r.CachedShare.Median, r.PooledShare.Median),
			f(r.TTFTp50, 3), f(r.TTFTp95, 2), f(r.TTFTp99, 2), f(r.OutputTPS, 0),
			f(r.ReplicasUsed, 0), r.Replicas, f(r.MaxMeanLoad, 2), f(r.Failed, 0))
	}
	for _, r := range rows {
		if v := r.VsBest; v != nil {
			fmt.Fprintf(w, "\n%s vs best peer (medians): cached share x%.2f (%s), TTFT p50 x%.2f (%s), p95 x%.2f (%s), p99 x%.2f (%s), output tok/s x%.2f (%s)\n",
				r.Policy, v.CachedShare, v.Best["cached_share"], v.TTFTp50, v.Best["ttft_p50"],
				v.TTFTp95, v.Best["ttft_p95"], v.TTFTp99, v.Best["ttft_p99"], v.OutputTPS, v.Best["output_tokens_per_s"])
		}
	}
	fmt.Fprintln(w)
}
