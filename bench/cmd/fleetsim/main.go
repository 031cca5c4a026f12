package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
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
		wl       = fs.String("workload", "all", "workload name, comma-separated names, or all ("+strings.Join(workload.Names, ", ")+"; not in all: "+strings.Join(workload.Variants, ", ")+"); with -trace, default none")
		policies = fs.String("policy", "all", "policy names, comma-separated, all ("+strings.Join(fleetsim.PolicyNames, ", ")+"), or oracle (the oracles only)")
		replicas = fs.Int("replicas", 8, "fleet size (spec-pair always uses 2)")
		seed     = fs.Uint64("seed", 1, "seed of -write-trace, -gen-trace and -sweep (comparisons use -seeds)")
		seedsS   = fs.String("seeds", "1,2,3", "seeds of the comparison, comma-separated: every figure is the median over them with min-max (default 1,2,3; -seed N alone means N)")
		scale    = fs.Float64("scale", 1, "scale of the larger workloads' request counts")
		short    = fs.Bool("short", false, "the CI form: scale 0.1")
		jsonOut  = fs.String("json", "", "also write the rows as JSON to this file (- for stdout)")
		plots    = fs.String("plots", "", "write one TTFT CDF per workload (first seed) as SVG into this directory")
		records  = fs.String("records", "", "write every request's outcome (first seed; id, session, turn, replica, sent, TTFT, prompt, cached, output, error, done) per workload and policy as CSV into this directory")
		writeTr  = fs.String("write-trace", "", "write the workload's trace (JSONL, or CSV for a .csv name), or with -gen-trace a Mooncake-format trace, to this file and exit")
		genTr    = fs.String("gen-trace", "", "with -write-trace: generate a Mooncake-format trace of this kind ("+strings.Join(workload.MooncakeKinds, ", ")+")")
		genSess  = fs.Int("gen-sessions", 0, "sessions (agents) of -gen-trace (0: the kind's default)")
		genRate  = fs.Float64("gen-rate", 0, "new sessions per second of -gen-trace (0: the kind's default)")
		genClose = fs.Bool("gen-closed", false, "with -gen-trace: write the sessions closed loop (each turn its gap after the previous turn completes) in this package's JSONL instead of the Mooncake format")
		traceF   = fs.String("trace", "", "replay this trace file (Mooncake-style JSONL, or this package's JSONL/CSV) as one more workload")
		sweep    = fs.Bool("sweep", false, "sweep ramjet's knobs instead of comparing policies (-policy names the swept variant; -affinity-cap etc. set the start)")
		parallel = fs.Int("parallel", 0, "concurrent runs (0: GOMAXPROCS)")
		preset   = fs.String("engine", "h200", "engine model preset: "+presetNames())
		kvCap    = fs.Int("kv-capacity", 0, "every replica's KV cache capacity in tokens (0: the preset's)")

		cap_   = fs.Int("affinity-cap", 0, "ramjet affinity_cap in tokens (0: default)")
		alpha  = fs.Float64("alpha", 0, "ramjet alpha (0: default)")
		cost   = fs.Int("request-cost", 0, "ramjet request_cost in tokens (0: default)")
		prefix = fs.Int("prefix-tokens", 0, "ramjet prefix_tokens (0: default)")
		budget = fs.Int64("index-budget", 0, "ramjet index_budget in bytes (0: default)")
		outW   = fs.Float64("output-weight", 0, "ramjet output_weight: score per requested output token on a replica whose engine profile fits (0: default)")
		ctxW   = fs.Float64("context-weight", fleetsim.RamjetContextWeight, "the ramjet-context variant's weight per prompt token of an in-flight request")

		routersS = fs.String("routers", "", "multi-router comparison: instance counts, comma-separated (e.g. 1,2,4); -policy then names "+strings.Join(fleetsim.MultiPolicyNames, ", ")+" (all: every one)")
		front    = fs.String("front", "rr", "with -routers: the front balancer splitting traffic over the instances ("+strings.Join(fleetsim.FrontNames, ", ")+")")
		decide   = fs.String("decisions", "", "write every ramjet decision (request, choice, each replica's overlap/load/score) to this file; forces -parallel 1")
		engLd    = fs.Duration("engine-load", 0, "ramjet policies scrape each simulated engine's running/waiting/KV at this interval and add the load they did not reserve (the module's engine_metrics; 0: off)")
		density  = fs.Float64("density", 0, "bytes of prompt text per real token that the ramjet policies' router sees (its blocks, PromptBytes and prefix bound are those of such a body; the engines count real tokens): code/JSON 2.5-3.5, prose 4.2-5 (0: the router's chars_per_token, 4)")
		cpuProf  = fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	)
	var mo workload.MooncakeOptions
	mo.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *short {
		*scale = 0.1
	}
	fleetsim.RamjetContextWeight = *ctxW
	fleetsim.RamjetEngineLoad = *engLd
	if *density != 0 && !(*density >= 0.5 && *density <= 64) {
		return fmt.Errorf("-density must be 0 or in [0.5, 64], got %v", *density)
	}
	fleetsim.RamjetDensity = *density
	defer func() { fleetsim.RamjetDensity = 0 }()
	if *decide != "" {
		f, err := os.Create(*decide)
		if err != nil {
			return fmt.Errorf("decisions: %w", err)
		}
		defer f.Close()
		bw := bufio.NewWriter(f)
		defer bw.Flush()
		fleetsim.RamjetTrace = bw
		defer func() { fleetsim.RamjetTrace = nil }()
		*parallel = 1
	}
	names := workload.Names
	switch {
	case *traceF != "" && !set["workload"]:
		names = nil
	case *wl != "all":
		names = strings.Split(*wl, ",")
	}
	pols := fleetsim.PolicyNames
	switch *policies {
	case "all":
	case fleetsim.Oracle: // the oracles' rows only
		pols = nil
	default:
		pols = strings.Split(*policies, ",")
	}
	seeds, err := parseSeeds(*seedsS)
	if err != nil {
		return err
	}
	if set["seed"] && !set["seeds"] {
		seeds = []uint64{*seed}
	}
	ecfg, err := engine.PresetConfig(*preset)
	if err != nil {
		return err
	}
	if *kvCap > 0 {
		ecfg.CapacityTokens = *kvCap
	}
	ecfg.MaxModelLen = 0 // the fleet simulation's DefaultMaxModelLen
	rcfg := selection.Config{AffinityCap: *cap_, Alpha: *alpha, RequestCost: *cost, PrefixTokens: *prefix, IndexBudget: *budget, OutputWeight: *outW}

	if *writeTr != "" {
		gen := workload.MooncakeGenOptions{Seed: *seed, Sessions: *genSess, Rate: *genRate, BlockTokens: mo.BlockTokens}
		return writeTrace(*writeTr, *genTr, gen, *genClose, names, *replicas, *scale)
	}
	var traces []*workload.Workload
	if *traceF != "" {
		w, err := workload.LoadFile(*traceF, mo)
		if err != nil {
			return err
		}
		traces = append(traces, w)
	}

	if *routersS != "" {
		return runMulti(stdout, multiArgs{
			routers: *routersS, front: *front, policies: *policies, names: names, traces: traces,
			replicas: *replicas, scale: *scale, parallel: *parallel, seeds: seeds, seedsS: *seedsS,
			preset: *preset, rcfg: rcfg, ecfg: ecfg, jsonOut: *jsonOut,
		})
	}
	if *sweep {
		sp := "ramjet"
		if *policies != "all" {
			sp = *policies
		}
		return runSweep(stdout, sp, names, *replicas, *seed, *scale, *parallel, rcfg, ecfg, *jsonOut)
	}

	start := time.Now()
	out, err := fleetsim.RunSeeds(fleetsim.SuiteConfig{
		Workloads: names, Traces: traces, Policies: pols, Replicas: *replicas, Scale: *scale,
		Ramjet: rcfg, Parallel: *parallel, Engine: ecfg,
	}, seeds)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "engine: %s, KV capacity %d tokens per replica, max_num_seqs %d; seeds %s\n\n",
		*preset, ecfg.CapacityTokens, ecfg.MaxRunningSeqs, *seedsS)
	var all []fleetsim.SeedSummary
	for _, wr := range out {
		title := fmt.Sprintf("%s (%s; %d requests; %d replicas; seeds %v)", wr.Workload.Name, wr.Workload.Summary, len(wr.Workload.Trace), wr.Rows[0].Replicas, seeds)
		fleetsim.WriteSeedTable(stdout, title, wr.Rows)
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
		if *records != "" {
			if err := writeRecords(*records, wr); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(stdout, "suite wall time: %.1fs\n", time.Since(start).Seconds())
	if *jsonOut != "" {
		return writeJSON(*jsonOut, stdout, all)
	}
	return nil
}

func presetNames() string {
	var b strings.Builder
	for i, p := range engine.Presets() {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s (%s)", p.Name, p.Summary)
	}
	return b.String()
}

func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("-seeds %q: %w", s, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func writeTrace(path, gen string, mo workload.MooncakeGenOptions, closed bool, names []string, replicas int, scale float64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	switch {
	case gen != "" && closed:
		var t workload.Trace
		t, err = workload.GenerateMooncakeClosed(gen, mo)
		if err == nil {
			err = t.WriteJSONL(f)
		}
	case gen != "":
		var rows []workload.MooncakeRow
		rows, err = workload.GenerateMooncake(gen, mo)
		if err == nil {
			err = workload.WriteMooncake(f, rows)
		}
	case len(names) != 1:
		err = fmt.Errorf("-write-trace needs exactly one -workload (or -gen-trace)")
	default:
		var w *workload.Workload
		w, err = workload.Generate(names[0], workload.Options{Seed: mo.Seed, Replicas: replicas, Scale: scale})
		if err == nil && strings.HasSuffix(path, ".csv") {
			err = w.Trace.WriteCSV(f)
		} else if err == nil {
			err = w.Trace.WriteJSONL(f)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
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

// writeRecords writes the first seed's per-request outcomes of every policy
// of one workload, one CSV file per policy, for comparing the requests that
// make a tail across policies.
func writeRecords(dir string, wr fleetsim.SeedsResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, res := range wr.First {
		p := filepath.Join(dir, fmt.Sprintf("records-%s-%d-%s.csv", wr.Workload.Name, res.Replicas, res.Policy))
		var b strings.Builder
		b.WriteString("id,session,turn,replica,sent,ttft,prompt,cached,output,err,done\n")
		for _, rec := range res.Records {
			sess, turn := -1, -1
			if rec.ID >= 0 && rec.ID < len(wr.Workload.Trace) {
				sess, turn = wr.Workload.Trace[rec.ID].Session, wr.Workload.Trace[rec.ID].Turn
			}
			fmt.Fprintf(&b, "%d,%d,%d,%d,%.4f,%.4f,%d,%d,%d,%q,%.4f\n", rec.ID, sess, turn, rec.Replica, rec.Sent, rec.TTFT(), rec.Prompt, rec.Cached, rec.Output, rec.Err, rec.Done)
		}
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func writePlot(path string, wr fleetsim.SeedsResult) error {
	var series []fleetsim.Series
	for _, res := range wr.First {
		s := fleetsim.Summarize(res)
		series = append(series, fleetsim.Series{Name: res.Policy, Values: s.TTFTs()})
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

func runSweep(stdout io.Writer, policy string, names []string, replicas int, seed uint64, scale float64, parallel int, start selection.Config, ecfg engine.Config, jsonPath string) error {
	t0 := time.Now()
	points, best, err := fleetsim.Sweep(fleetsim.SweepConfig{
		Suite: fleetsim.SuiteConfig{Workloads: names, Replicas: replicas, Seed: seed, Scale: scale, Parallel: parallel, Engine: ecfg},
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
