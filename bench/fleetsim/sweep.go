package fleetsim

import (
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/ramjet-llm/ramjet/selection"
)

// Knob is one of ramjet's knobs and the values a sweep tries.
type Knob struct {
	Name   string
	Values []float64
	set    func(*selection.Config, float64)
	get    func(selection.Config) float64
}

// Knobs lists the swept knobs in sweep order.
func Knobs() []Knob {
	return []Knob{
		{"prefix_tokens", []float64{8192, 16384, 32768, 65536, 131072},
			func(c *selection.Config, v float64) { c.PrefixTokens = int(v) },
			func(c selection.Config) float64 { return float64(c.PrefixTokens) }},
		{"affinity_cap", []float64{4096, 8192, 16384, 32768, 65536, 131072},
			func(c *selection.Config, v float64) { c.AffinityCap = int(v) },
			func(c selection.Config) float64 { return float64(c.AffinityCap) }},
		{"alpha", []float64{0.25, 0.5, 1, 2, 4},
			func(c *selection.Config, v float64) { c.Alpha = v },
			func(c selection.Config) float64 { return c.Alpha }},
		{"request_cost", []float64{256, 512, 1024, 2048, 4096},
			func(c *selection.Config, v float64) { c.RequestCost = int(v) },
			func(c selection.Config) float64 { return float64(c.RequestCost) }},
		{"index_budget", []float64{1 << 16, 1 << 18, 1 << 20, 16 << 20, 64 << 20},
			func(c *selection.Config, v float64) { c.IndexBudget = int64(v) },
			func(c selection.Config) float64 { return float64(c.IndexBudget) }},
	}
}

// SweepPoint is one configuration's outcome over the sweep's workloads.
type SweepPoint struct {
	Knob   string           `json:"knob"`
	Value  float64          `json:"value"`
	Config selection.Config `json:"config"`
	// Objective is the geometric mean, over workloads and over TTFT p50,
	// p95 and p99, of ramjet's TTFT divided by the best peer's at that
	// percentile (lower is better; 1 ties the best peer everywhere).
	Objective float64 `json:"objective"`
	// Per workload: TTFT p95 (s), TTFT p50 (s), cached share, replicas
	// used.
	P95    map[string]float64 `json:"ttft_p95_s"`
	P50    map[string]float64 `json:"ttft_p50_s"`
	Share  map[string]float64 `json:"cached_share"`
	Used   map[string]int     `json:"replicas_used"`
	Chosen bool               `json:"chosen"`
}

// SweepConfig describes a coordinate sweep.
type SweepConfig struct {
	Suite SuiteConfig
	// Start is the starting configuration (zero fields: defaults).
	Start selection.Config
	// Policy is the swept policy: "ramjet" (default) or a ramjet variant.
	Policy string
	// Progress, if set, receives a line per evaluated point.
	Progress io.Writer
}

// Sweep runs a coordinate sweep over Knobs: for each knob in turn, every
// value is tried with the other knobs at their current best, and the value
// with the lowest objective is kept (ties keep the current value). The
// peers run once per workload for the baseline. It returns every evaluated
// point and the chosen configuration.
func Sweep(sc SweepConfig) ([]SweepPoint, selection.Config, error) {
	if sc.Policy == "" {
		sc.Policy = "ramjet"
	}
	base := sc.Suite
	var peers []string
	for _, p := range PolicyNames {
		if p != "ramjet" {
			peers = append(peers, p)
		}
	}
	base.Policies = peers
	peerOut, err := RunSuite(base)
	if err != nil {
		return nil, selection.Config{}, err
	}
	// The best peer per workload and percentile.
	bestPeer := make(map[string][3]float64)
	for _, wr := range peerOut {
		b := [3]float64{math.Inf(1), math.Inf(1), math.Inf(1)}
		for _, r := range wr.Rows {
			if r.Policy == Oracle {
				continue
			}
			b[0], b[1], b[2] = math.Min(b[0], r.TTFTp50), math.Min(b[1], r.TTFTp95), math.Min(b[2], r.TTFTp99)
		}
		bestPeer[wr.Workload.Name] = b
	}

	cur := sc.Start
	cur.SetDefaults()
	eval := func(knob string, v float64, cfg selection.Config) (SweepPoint, error) {
		s := sc.Suite
		s.Policies = []string{sc.Policy}
		s.Ramjet = cfg
		out, err := RunSuite(s)
		if err != nil {
			return SweepPoint{}, err
		}
		pt := SweepPoint{Knob: knob, Value: v, Config: cfg,
			P95: map[string]float64{}, P50: map[string]float64{}, Share: map[string]float64{}, Used: map[string]int{}}
		logSum := 0.0
		for _, wr := range out {
			r := wr.Rows[0]
			name := wr.Workload.Name
			pt.P95[name], pt.P50[name], pt.Share[name], pt.Used[name] = r.TTFTp95, r.TTFTp50, r.CachedShare, r.ReplicasUsed
			b := bestPeer[name]
			for k, v := range [3]float64{r.TTFTp50, r.TTFTp95, r.TTFTp99} {
				logSum += math.Log(math.Max(v, 1e-6) / math.Max(b[k], 1e-6))
			}
		}
		pt.Objective = math.Exp(logSum / float64(3*len(out)))
		if sc.Progress != nil {
			fmt.Fprintf(sc.Progress, "sweep %s=%g objective %.4f\n", knob, v, pt.Objective)
		}
		return pt, nil
	}

	var points []SweepPoint
	memo := make(map[selection.Config]SweepPoint)
	for _, k := range Knobs() {
		bestIdx, bestObj := -1, math.Inf(1)
		curVal := k.get(cur)
		for _, v := range k.Values {
			cfg := cur
			k.set(&cfg, v)
			pt, ok := memo[cfg]
			if ok {
				pt.Knob, pt.Value = k.Name, v
			} else {
				pt, err = eval(k.Name, v, cfg)
				if err != nil {
					return nil, selection.Config{}, err
				}
				memo[cfg] = pt
			}
			points = append(points, pt)
			// Strictly better by more than 1%, or equal to the current value.
			if pt.Objective < bestObj*0.99 || (v == curVal && pt.Objective <= bestObj*1.01) {
				bestIdx, bestObj = len(points)-1, pt.Objective
			}
		}
		points[bestIdx].Chosen = true
		k.set(&cur, points[bestIdx].Value)
	}
	return points, cur, nil
}

// WriteSweep writes the sweep's points as a markdown table.
func WriteSweep(w io.Writer, points []SweepPoint, workloads []string) {
	fmt.Fprint(w, "| knob | value | objective |")
	for _, n := range workloads {
		fmt.Fprintf(w, " %s p95 (s) / share |", n)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "|---|---:|---:|")
	for range workloads {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, p := range points {
		mark := ""
		if p.Chosen {
			mark = " **chosen**"
		}
		fmt.Fprintf(w, "| %s | %s%s | %.3f |", p.Knob, strconv.FormatFloat(p.Value, 'f', -1, 64), mark, p.Objective)
		for _, n := range workloads {
			fmt.Fprintf(w, " %.2f / %.2f |", p.P95[n], p.Share[n])
		}
		fmt.Fprintln(w)
	}
}
