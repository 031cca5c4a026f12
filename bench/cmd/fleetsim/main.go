// Command fleetsim runs the fleet simulation: every routing policy on every
// workload, over simulated engines, and prints one table per workload.
//
//	go run ./bench/cmd/fleetsim -workload all -replicas 8
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsim:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("fleetsim", flag.ContinueOnError)
	var (
		wl       = fs.String("workload", "all", "workload name, comma-separated names, or all ("+strings.Join(workload.Names, ", ")+")")
		policies = fs.String("policy", "all", "policy names, comma-separated, or all ("+strings.Join(fleetsim.PolicyNames, ", ")+")")
		replicas = fs.Int("replicas", 8, "fleet size (spec-pair always uses 2)")
		seed     = fs.Uint64("seed", 1, "seed of the workload generators and the peers' random choices")
		scale    = fs.Float64("scale", 1, "scale of the larger workloads' request counts")
		short    = fs.Bool("short", false, "the CI form: scale 0.1")
		jsonOut  = fs.String("json", "", "also write the rows as JSON to this file (- for stdout)")
		plots    = fs.String("plots", "", "write one TTFT CDF per workload as SVG into this directory")
		trace    = fs.String("trace", "", "write the workload's trace (JSONL, or CSV for a .csv name) to this file and exit (one workload only)")
		sweep    = fs.Bool("sweep", false, "sweep ramjet's knobs instead of comparing policies (-policy names the swept variant; -affinity-cap etc. set the start)")
		parallel = fs.Int("parallel", 0, "concurrent runs (0: GOMAXPROCS)")

		cap_   = fs.Int("affinity-cap", 0, "ramjet affinity_cap in tokens (0: default)")
		alpha  = fs.Float64("alpha", 0, "ramjet alpha (0: default)")
		cost   = fs.Int("request-cost", 0, "ramjet request_cost in tokens (0: default)")
		prefix = fs.Int("prefix-tokens", 0, "ramjet prefix_tokens (0: default)")
		budget = fs.Int64("index-budget", 0, "ramjet index_budget in bytes (0: default)")
		outW   = fs.Float64("output-weight", 0, "ramjet output_weight: score per requested output token on a replica whose engine profile fits (0: default)")
		ctxW   = fs.Float64("context-weight", fleetsim.RamjetContextWeight, "the ramjet-context variant's weight per prompt token of an in-flight request")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *short {
		*scale = 0.1
	}
	fleetsim.RamjetContextWeight = *ctxW
	names := workload.Names
	if *wl != "all" {
		names = strings.Split(*wl, ",")
	}
	pols := fleetsim.PolicyNames
	if *policies != "all" {
		pols = strings.Split(*policies, ",")
	}
	rcfg := selection.Config{AffinityCap: *cap_, Alpha: *alpha, RequestCost: *cost, PrefixTokens: *prefix, IndexBudget: *budget, OutputWeight: *outW}

	if *trace != "" {
		if len(names) != 1 {
			return fmt.Errorf("-trace needs exactly one -workload")
		}
		w, err := workload.Generate(names[0], workload.Options{Seed: *seed, Replicas: *replicas, Scale: *scale})
		if err != nil {
			return err
		}
		f, err := os.Create(*trace)
		if err != nil {
			return err
		}
		if strings.HasSuffix(*trace, ".csv") {
			err = w.Trace.WriteCSV(f)
		} else {
			err = w.Trace.WriteJSONL(f)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}

	if *sweep {
		sp := "ramjet"
		if *policies != "all" {
			sp = *policies
		}
		return runSweep(stdout, sp, names, *replicas, *seed, *scale, *parallel, rcfg, *jsonOut)
	}

	start := time.Now()
	out, err := fleetsim.RunSuite(fleetsim.SuiteConfig{
		Workloads: names, Policies: pols, Replicas: *replicas, Seed: *seed, Scale: *scale,
		Ramjet: rcfg, Parallel: *parallel,
	})
	if err != nil {
		return err
	}
	var all []fleetsim.Summary
	for _, wr := range out {
		title := fmt.Sprintf("%s (%s; %d requests; %d replicas; seed %d)", wr.Workload.Name, wr.Workload.Summary, len(wr.Workload.Trace), wr.Rows[0].Replicas, *seed)
		fleetsim.WriteTable(stdout, title, wr.Rows)
		all = append(all, wr.Rows...)
		if *plots != "" {
			if err := os.MkdirAll(*plots, 0o755); err != nil {
				return err
			}
			p := filepath.Join(*plots, fmt.Sprintf("fleetsim-%s-%d.svg", wr.Workload.Name, wr.Rows[0].Replicas))
			if err := writePlot(p, wr); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "plot: %s\n\n", p)
		}
	}
	fmt.Fprintf(stdout, "suite wall time: %.1fs\n", time.Since(start).Seconds())
	if *jsonOut != "" {
		return writeJSON(*jsonOut, stdout, all)
	}
	return nil
}

func writeJSON(path string, stdout io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func writePlot(path string, wr fleetsim.WorkloadResult) error {
	var series []fleetsim.Series
	for i := range wr.Rows {
		r := &wr.Rows[i]
		if r.Policy == fleetsim.Oracle {
			continue
		}
		series = append(series, fleetsim.Series{Name: r.Policy, Values: r.TTFTs()})
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("TTFT CDF: %s, %d replicas", wr.Workload.Name, wr.Rows[0].Replicas)
	err = fleetsim.WriteCDF(f, title, "TTFT (s, log scale)", series)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func runSweep(stdout io.Writer, policy string, names []string, replicas int, seed uint64, scale float64, parallel int, start selection.Config, jsonPath string) error {
	t0 := time.Now()
	points, best, err := fleetsim.Sweep(fleetsim.SweepConfig{
		Suite: fleetsim.SuiteConfig{Workloads: names, Replicas: replicas, Seed: seed, Scale: scale, Parallel: parallel},
		Start: start, Policy: policy, Progress: os.Stderr,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "### %s parameter sweep (%d replicas, seed %d, scale %g)\n\n", policy, replicas, seed, scale)
	fmt.Fprintln(stdout, "Objective: geometric mean, over the workloads and over TTFT p50/p95/p99, of ramjet's TTFT / the best peer's TTFT at that percentile (lower is better).")
	fmt.Fprintln(stdout)
	fleetsim.WriteSweep(stdout, points, names)
	fmt.Fprintf(stdout, "\nchosen: affinity_cap %d, alpha %g, request_cost %d, prefix_tokens %d, index_budget %d\n",
		best.AffinityCap, best.Alpha, best.RequestCost, best.PrefixTokens, best.IndexBudget)
	fmt.Fprintf(stdout, "sweep wall time: %.1fs\n", time.Since(t0).Seconds())
	if jsonPath != "" {
		return writeJSON(jsonPath, stdout, map[string]any{"points": points, "chosen": best})
	}
	return nil
}
