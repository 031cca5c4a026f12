package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/peerproxy"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/module"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2ecompare:", err)
		os.Exit(1)
	}
}

// Row is one (workload, policy) result.
type Row struct {
	Workload string  `json:"workload"`
	Policy   string  `json:"policy"`
	Requests int     `json:"requests"`
	OK       int     `json:"completed"`
	Failed   int     `json:"failed"`
	NotSent  int     `json:"not_sent"`
	Cached   float64 `json:"cached_share"`
	// TTFT percentiles and throughput in simulated time. The percentiles
	// are stats.Percentile over the run's raw TTFTs (loadgen keeps them,
	// bounded), the definition fleetsim uses, so the two tables compare.
	TTFTp50   float64 `json:"ttft_p50_s"`
	TTFTp95   float64 `json:"ttft_p95_s"`
	TTFTp99   float64 `json:"ttft_p99_s"`
	OutputTPS float64 `json:"output_tokens_per_s"`
	// ReplicasUsed and MaxMeanLoad as the fleet simulation defines them.
	ReplicasUsed int     `json:"replicas_used"`
	MaxMeanLoad  float64 `json:"max_mean_load"`
	// DensityDrift is the median prompt-token drift against the trace.
	DensityDrift float64 `json:"density_median_drift"`
	WallSeconds  float64 `json:"wall_s"`
	// Front counts the requests the front balancer sent to each router
	// instance (multi-router rows only, -routers).
	Front  []int64         `json:"front,omitempty"`
	Report *loadgen.Report `json:"report"`
	// Preflight is the precise path's record of its tokenize preflights
	// (ramjet-precise only), read from the module in process.
	Preflight *module.KVPreflightReport `json:"preflight,omitempty"`
	// Peer is the adapter's record of a fleetsim peer's run (peer.go).
	Peer *peerproxy.Stats `json:"peer,omitempty"`
	// CPUSeconds is the process's CPU time (user + system) over the run:
	// engines, Caddy and load generator together, all in this process.
	CPUSeconds float64 `json:"cpu_s"`
	// CaddyCPUSeconds is the Caddy process's CPU time (user + system)
	// when it ran apart (-caddy-bin, solo.go); CPUSeconds is then the
	// engines' and load generator's.
	CaddyCPUSeconds float64 `json:"caddy_cpu_s,omitempty"`
	// InstanceKV is, per instance of a precise multi-router row run as
	// separate processes (-routers-policy ramjet-precise -procs), its
	// decisions by mode, tokenize fallbacks and applied KV events, read
	// from its /metrics before it stops (summarizeKV).
	InstanceKV []string `json:"instance_kv,omitempty"`
	// KV is, for the runs in the in-process Caddy, its routing series
	// (scrapeRouting: tokenize preflights, decisions by mode, foreign
	// prefill and share, other instances seen, index evictions) read
	// after the run, summed over the instances of a -routers row.
	KV string `json:"kv,omitempty"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("e2ecompare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		workloads = fs.String("workload", "locality,burst,agent-fleet", "workloads, comma-separated ("+strings.Join(workload.Names, ", ")+")")
		policies  = fs.String("policy", "ramjet,round_robin,least_conn", "Caddy selection policies, comma-separated; ramjet and ramjet-precise (lb_policy ramjet fed by the engines' KV events) know the engines' KV capacity (kv_capacity), ramjet-nocap does not; each takes fleetsim's options ixs (index_share) and qx (queue_extra), 0 or -1 off: ramjet@ixs=-1+qx=-1 is the approximate path before the full-cache model; ramjet-precise takes always (tokenize_wait always: ramjet-precise@always, as fleetsim's) and wait (auto, the default), and qe (the kv block's queue_estimate, fleetsim's: ramjet-precise@qe=0 is the precise path before the queue rule) noqx (queue_extra off, fleetsim's: the precise path's rule before 2026-12-07), and capl, capm, capg, capgf, capfit and capfq (the kv block's cap_load, cap_peer, cap_gain, cap_gain with cap_gain_fleet, cap_fit and cap_foreign_queue, fleetsim's: a key left out keeps the module's default, the lift stack capl=3+capm=1.1+capgf=0.75+capfit=2.5, and 0 turns it off; ramjet-precise@capl=0 is the estimate cap everywhere, the rule before the stack, ramjet-precise@capfq=0 the rule before 2026-12-07); "+strings.Join(Peers, ", ")+" are the fleet simulation's peers run inside Caddy (bench/peerproxy); empty: only the -routers rows")
		replicas  = fs.Int("replicas", 8, "engine simulators")
		seed      = fs.Uint64("seed", 1, "workload seed (the fleet simulation's -seed)")
		scale     = fs.Float64("scale", 0.25, "workload request-count scale (the fleet simulation's -scale)")
		timeScale = fs.Float64("time-scale", 4, "engines and trace run this much faster than real time")
		history   = fs.String("history", "actual", "later turns carry the engine's actual reply or a synthetic stand-in")
		timeout   = fs.Duration("timeout", 2*time.Minute, "per-request timeout (wall)")
		maxDur    = fs.Duration("max-duration", 10*time.Minute, "wall-time limit of one run")
		asJSON    = fs.Bool("json", false, "print JSON rows instead of a Markdown table")
		kvCap     = fs.Int("kv-capacity", 0, "KV cache capacity per engine in tokens (0: default)")
		routersS  = fs.String("routers", "", "also run ramjet as this many independent instances (comma-separated, e.g. 2,4) behind a front balancer: one row per count after each workload's policies")
		frontS    = fs.String("front", "rr", "with -routers: the front balancer's policy (rr or random), per request")
		routerPol = fs.String("routers-policy", "ramjet", "with -routers: the instances' policy, comma-separated: ramjet (each its own approximate index) or ramjet-precise (each subscribed to every engine's KV events), both told the engines' KV capacity (kv_capacity) as the single-instance rows; ramjet-nocap and ramjet-precise-nocap leave it unknown (every -routers row before 2026-12-05 21:30); each takes -policy's @options (ramjet-precise@always, ramjet@ixs=-1+qx=-1)")
		procsBin  = fs.String("procs", "", "with -routers: run each instance as its own Caddy process of this binary (go build -o caddy ./xcaddy) instead of a site of the in-process Caddy")
		engMet    = fs.Duration("engine-metrics", 0, "with -routers: every instance scrapes the engines' metrics at this wall interval (engine_metrics; 0: off)")
		foreignS  = fs.String("foreign-prefill", "", "with -routers -routers-policy ramjet-precise: every instance's foreign_prefill (on, off or queues; empty: the module's default)")
		tokTO     = fs.Duration("tokenize-timeout", 0, "ramjet-precise: the tokenize preflight's timeout (0: the module's default)")
		instID    = fs.String("instance-id", SoloInstance, "the instance_id of the single-instance rows of ramjet, ramjet-nocap and ramjet-precise: "+SoloInstance+" (spill position 0) as the -routers rows' instance 0 and the fleet simulation's lone instance; empty: the module's default, the host name (a hashed spill position: with kv the spill band then moves load overrides)")
		kvEvents  = fs.String("kv-events", "all", "which runs' engines publish KV events over ZMQ: all (every policy's engines publish, only ramjet-precise subscribes: the arms differ only in the router) or precise (ramjet-precise's engines only)")
		cpuProf   = fs.String("cpuprofile", "", "write a CPU profile of each run (engines, Caddy and load generator: one process) to <prefix>-<n>-<workload>-<policy>.pprof")
		resultsF  = fs.String("results", "", "also write every request's result (trace index, upstream, TTFT, cached tokens...) as JSON lines, one file per run (not with -caddy-bin): <prefix>-<n>-<workload>-<policy>.jsonl")
		traceF    = fs.String("trace", "", "also replay this trace file (Mooncake-style JSONL or bench/workload JSONL/CSV; see -trace-*); alone unless -workload is given")
		density   = fs.Float64("density", engine.BytesPerToken, "content density: the engines' tokenizer stand-in cuts text at this many bytes per token (fractional allowed; code and tool output 2.5-3.5, prose 4.2-5) and the load generator renders every row's tokens at it, so the engines run the same tokens at any density and only the bytes the router sees change")
	)
	solo := registerSolo(fs)
	var mo workload.MooncakeOptions
	mo.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var ws []*workload.Workload
	workloadSet := false
	fs.Visit(func(f *flag.Flag) { workloadSet = workloadSet || f.Name == "workload" })
	if *traceF == "" || workloadSet {
		for _, name := range strings.Split(*workloads, ",") {
			w, err := workload.Generate(strings.TrimSpace(name), workload.Options{Seed: *seed, Replicas: *replicas, Scale: *scale})
			if err != nil {
				return err
			}
			ws = append(ws, w)
		}
	}
	if *traceF != "" {
		w, err := workload.LoadFile(*traceF, mo)
		if err != nil {
			return err
		}
		ws = append(ws, w)
	}
	hist, err := loadgen.ParseHistoryMode(*history)
	if err != nil {
		return err
	}
	if *replicas < 1 || *timeScale <= 0 {
		return errors.New("-replicas and -time-scale must be positive")
	}
	if *kvEvents != "all" && *kvEvents != "precise" {
		return fmt.Errorf("-kv-events %q: want all or precise", *kvEvents)
	}
	tok := engine.Tokenizer{Density: *density}
	if err := tok.Validate(); err != nil {
		return fmt.Errorf("-density: %w", err)
	}
	routers, front, err := parseRouters(*routersS, *frontS)
	if err != nil {
		return err
	}
	for _, pol := range strings.Split(*policies, ",") {
		if _, _, err := parseTarget(strings.TrimSpace(pol)); err != nil {
			return err
		}
		if isPeer(strings.TrimSpace(pol)) && tok.BytesPerToken() != engine.BytesPerToken {
			return fmt.Errorf("-density %g: the peers' adapter (bench/peerproxy) tokenizes at %d bytes per token", *density, engine.BytesPerToken)
		}
	}
	if len(routers) > 0 {
		for _, rpol := range strings.Split(*routerPol, ",") {
			if _, _, err := parseRoutersTarget(strings.TrimSpace(rpol)); err != nil {
				return err
			}
		}
	}
	var progress io.Writer
	if f, ok := stderr.(*os.File); ok && loadgen.IsTerminal(f) {
		progress = stderr
	}
	var rows []Row
	for _, w := range ws {
		n := *replicas
		if w.Replicas > 0 {
			n = w.Replicas
		}
		for _, pol := range strings.Split(*policies, ",") {
			pol = strings.TrimSpace(pol)
			if pol == "" { // -policy "": only the -routers rows
				continue
			}
			fmt.Fprintf(stderr, "e2ecompare: %s with %s (%d requests, %d replicas)\n", w.Name, pol, len(w.Trace), n)
			stopProf, err := startProfile(*cpuProf, len(rows), w.Name, pol)
			if err != nil {
				return err
			}
			cpu0 := cpuSeconds()
			publish := *kvEvents == "all" || policyBase(pol) == "ramjet-precise" || peerNeedsKV(pol)
			results, closeResults, err := resultsFile(*resultsF, len(rows), w.Name, pol)
			if err != nil {
				return err
			}
			var row Row
			if *solo.bin != "" && isPeer(pol) {
				err = fmt.Errorf("-caddy-bin: the peers run only in the in-process Caddy")
			} else if *solo.bin != "" {
				row, err = runSolo(ctx, w, pol, n, *kvCap, *seed, *timeScale, tok, hist, *timeout, *maxDur, *tokTO, publish, progress,
					solo, profileName(*cpuProf, len(rows), w.Name, pol+"-router"), *instID, stderr)
			} else {
				row, err = runOne(ctx, w, pol, n, *kvCap, *seed, *timeScale, tok, hist, *timeout, *maxDur, *tokTO, *instID, publish, progress, results)
			}
			if cerr := closeResults(); err == nil {
				err = cerr
			}
			row.CPUSeconds = cpuSeconds() - cpu0
			if perr := stopProf(); err == nil {
				err = perr
			}
			if err != nil {
				return fmt.Errorf("%s/%s: %w", w.Name, pol, err)
			}
			rows = append(rows, row)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		for _, rpol := range strings.Split(*routerPol, ",") {
			rpol = strings.TrimSpace(rpol)
			base, settings, err := parseRoutersTarget(rpol) // checked above
			if err != nil {
				return err
			}
			base, nocap := strings.CutSuffix(base, "-nocap")
			precise := base == "ramjet-precise"
			for _, k := range routers {
				fmt.Fprintf(stderr, "e2ecompare: %s with %d %s instances behind a %s front (%d requests, %d replicas)\n", w.Name, k, rpol, front, len(w.Trace), n)
				label := fmt.Sprintf("%s-x%d", rpol, k)
				results, closeResults, err := resultsFile(*resultsF, len(rows), w.Name, label)
				if err != nil {
					return err
				}
				row, err := runMulti(ctx, w, k, front, n, *kvCap, *seed, *timeScale, hist, *timeout, *maxDur,
					multiOpts{tok: tok, bin: *procsBin, precise: precise, nocap: nocap, em: *engMet, tokTO: *tokTO, foreign: *foreignS, results: results,
						name: rpol, settings: settings}, progress, stderr)
				if cerr := closeResults(); err == nil {
					err = cerr
				}
				if err != nil {
					return fmt.Errorf("%s/%s x%d: %w", w.Name, rpol, k, err)
				}
				rows = append(rows, row)
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	fmt.Fprintf(stdout, "replicas=%d seed=%d scale=%g time-scale=%g history=%s GOMAXPROCS=%d; times in simulated seconds\n\n",
		*replicas, *seed, *scale, *timeScale, hist, runtime.GOMAXPROCS(0))
	fmt.Fprint(stdout, markdown(rows))
	return nil
}

// engineModel is the model name every simulated engine serves.
const engineModel = "sim"

// startEngines starts n engine simulators for w (the speculative replicas
// w names draft 4 tokens), whose PUB and replay sockets are on when
// publish, and whose tokenizer is tok (-density), and returns them with
// their addresses; on an error the ones started are returned too, for
// closeEngines.
func startEngines(ctx context.Context, w *workload.Workload, n, kvCapacity int, ts float64, tok engine.Tokenizer, publish bool) ([]*enginesim.Server, []string, error) {
	sims := make([]*enginesim.Server, 0, n)
	addrs := make([]string, 0, n)
	tokenized := &enginesim.TokenizeLog{} // the results' tokenize times (loadgen.Result.TokenizeStart)
	for i := range n {
		o := enginesim.Options{
			Model: engineModel, TimeScale: ts, Seed: uint64(i) + 1,
			// The fleet simulation's context limit (fleetsim.DefaultMaxModelLen),
			// so that agent contexts may pass 100k tokens as there.
			Engine:  engine.Config{MaxModelLen: 131072, CapacityTokens: kvCapacity},
			Density: tok.Density, Tokenized: tokenized,
		}
		if slices.Contains(w.Speculative, i) {
			o.Engine.SpecTokens = 4
		}
		if publish {
			o.KVEvents = enginesim.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"}
		}
		s, err := enginesim.Start(ctx, o)
		if err != nil {
			return sims, addrs, err
		}
		sims = append(sims, s)
		addrs = append(addrs, s.Addr())
	}
	return sims, addrs, nil
}

// closeEngines stops the simulators startEngines started.
func closeEngines(sims []*enginesim.Server) {
	for _, s := range sims {
		s.Close()
	}
}

// kvConfig is the precise path's kv settings over sims (their KV event
// and replay sockets) at addrs.
func kvConfig(sims []*enginesim.Server, addrs []string, tokTO time.Duration) map[string]any {
	var engines []map[string]any
	for i, s := range sims {
		engines = append(engines, map[string]any{"upstream": addrs[i], "events": s.KVEndpoints()[0], "replay": s.KVReplayEndpoints()[0]})
	}
	kv := map[string]any{"engines": engines, "block_size": 16}
	if tokTO > 0 {
		kv["tokenize_timeout"] = tokTO.String()
	}
	return kv
}

// runOne replays w through Caddy with policy pol in front of n fresh
// engine simulators, whose PUB and replay sockets are on when publish;
// inst is the ramjet instance_id (siteFor).
func runOne(ctx context.Context, w *workload.Workload, pol string, n, kvCapacity int, seed uint64, ts float64, tok engine.Tokenizer,
	hist loadgen.HistoryMode, timeout, maxDur, tokTO time.Duration, inst string, publish bool, progress io.Writer, results func(*loadgen.Result)) (Row, error) {
	sims, addrs, err := startEngines(ctx, w, n, kvCapacity, ts, tok, publish)
	defer closeEngines(sims)
	if err != nil {
		return Row{}, err
	}
	if results != nil {
		// The replicas in order: the per-request results (-results) name
		// the upstream by address, which differs between runs.
		fmt.Fprintf(os.Stderr, "e2ecompare: engines %s\n", strings.Join(addrs, " "))
	}
	site := siteFor(pol, addrs, sims, tokTO, inst)
	var peer *peerproxy.Adapter
	if isPeer(pol) {
		var stopPeer func()
		if site, peer, stopPeer, err = peerSite(ctx, pol, seed, w, sims, addrs); err != nil {
			return Row{}, err
		}
		defer stopPeer()
	}
	running, err := caddyrun.Start([]caddyrun.Site{site, metricsSite(addrs)})
	if err != nil {
		return Row{}, err
	}
	defer caddyrun.Stop()

	client, err := loadgen.NewClient(loadgen.ClientConfig{
		BaseURL: running.URL("lb"), Model: engineModel, Timeout: timeout,
		UpstreamHeader: caddyrun.SpreadHeader, IgnoreEOS: true,
	})
	if err != nil {
		return Row{}, err
	}
	defer client.Close()
	start := time.Now()
	rep, err := loadgen.Run(ctx, loadgen.RunConfig{
		Label: w.Name + "/" + pol, Trace: w.Trace, Client: client,
		Synth: loadgen.Synthesizer{Synth: workload.Synth{Salt: seed}, History: hist, Tokenizer: tok},
		Mode:  loadgen.ModeOpen, Concurrency: 1024, TimeScale: ts, MaxDuration: maxDur,
		Progress: progress, Results: results,
	})
	if err != nil {
		return Row{}, err
	}
	var pre *module.KVPreflightReport
	if policyBase(pol) == "ramjet-precise" {
		if r, ok := module.KVPreflight(module.DefaultStateKey); ok {
			pre = &r
		}
	}
	row := reportRow(w.Name, pol, n, ts, rep, time.Since(start))
	row.Preflight = pre
	if row.KV, err = scrapeRouting(running); err != nil {
		return Row{}, fmt.Errorf("metrics: %w", err)
	}
	if peer != nil {
		// Read once Caddy is down: every handler has returned, so the
		// adapter's in-flight counts must all be 0 (Stats.InFlight).
		client.Close()
		if err := caddyrun.Stop(); err != nil {
			return Row{}, err
		}
		st := peer.Stats()
		row.Peer = &st
	}
	return row, nil
}

// siteFor is the Caddy site "lb" of policy pol over the engines sims at
// addrs; ramjet-precise is lb_policy ramjet subscribed to their KV events,
// with the tokenize timeout tokTO (0: the module's default). A ramjet
// target with options (ramjet@ixs=-1+qx=-1, parseTarget) is its base with
// those lb_policy ramjet settings.
//
// ramjet and ramjet-precise know the engines' KV capacity (kv_capacity), as
// the fleet simulation's rows of those names do (SetCapacity, what the
// module's engine_metrics scraper learns from vllm:cache_config_info);
// ramjet-nocap leaves it unknown, as fleetsim's ramjet-nocap and every
// e2ecompare run before 2026-12-05 14:00.
//
// inst, when not empty, is their instance_id: SoloInstance puts the lone
// instance at spill position 0, as the fleet simulation's single-instance
// rows are; unset, the module takes the host name's hashed position, and
// with kv its spill band (1,024 tokens of score by default) then deals the
// load overrides within the band by that position, which the simulation's
// rows do not (bench/RESULTS.md, "The precise path's placements through
// HTTP on the tool-agent window").
func siteFor(pol string, addrs []string, sims []*enginesim.Server, tokTO time.Duration, inst string) caddyrun.Site {
	base, settings, _ := parseTarget(pol) // checked by run
	switch base {
	case "ramjet", "ramjet-nocap", "ramjet-precise":
		site := caddyrun.RamjetSite("lb", "ramjet", addrs)
		site.PolicyConfig = map[string]any{}
		if inst != "" {
			site.PolicyConfig["instance_id"] = inst
		}
		if base != "ramjet-nocap" {
			site.PolicyConfig["kv_capacity"] = engineCapacity(sims)
		}
		if base == "ramjet-precise" {
			site.PolicyConfig["kv"] = kvConfig(sims, addrs, tokTO)
		}
		applySettings(site.PolicyConfig, settings)
		return site
	}
	return caddyrun.Site{Name: "lb", Policy: pol, Upstreams: addrs}
}

// engineCapacity is the KV cache capacity in tokens of each engine of sims
// (they share one engine configuration), as the engine reports it.
func engineCapacity(sims []*enginesim.Server) int {
	ec := sims[0].Options().Engine
	ec.SetDefaults()
	return ec.TotalBlocks() * ec.BlockSize
}

// SoloInstance is the single-instance rows' default instance_id: the
// -routers rows' instance 0 (multiSites), spill position 0.
const SoloInstance = "ramjet-0"

// profileName is run n's profile file name without extension, "" without
// a prefix.
func profileName(prefix string, n int, wl, pol string) string {
	if prefix == "" {
		return ""
	}
	return fmt.Sprintf("%s-%d-%s-%s", prefix, n, strings.NewReplacer("/", "_", ":", "_").Replace(wl), pol)
}

// resultsFile opens run n's per-request results file
// <prefix>-<n>-<workload>-<policy>.jsonl and returns loadgen's Results
// hook writing one JSON line per request, and the func that closes it. No
// prefix: no hook.
func resultsFile(prefix string, n int, wl, pol string) (func(*loadgen.Result), func() error, error) {
	if prefix == "" {
		return nil, func() error { return nil }, nil
	}
	f, err := os.Create(profileName(prefix, n, wl, pol) + ".jsonl")
	if err != nil {
		return nil, nil, fmt.Errorf("results: %w", err)
	}
	enc := json.NewEncoder(f)
	var werr error
	hook := func(r *loadgen.Result) {
		if werr == nil {
			werr = enc.Encode(r)
		}
	}
	return hook, func() error { return errors.Join(werr, f.Close()) }, nil
}

// startProfile starts a CPU profile of run n into
// <prefix>-<n>-<workload>-<policy>.pprof; the returned func stops it and
// closes the file. No prefix: nothing.
func startProfile(prefix string, n int, wl, pol string) (func() error, error) {
	if prefix == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(profileName(prefix, n, wl, pol) + ".pprof")
	if err != nil {
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// cpuSeconds is the process's CPU time so far (user + system).
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func markdown(rows []Row) string {
	var sb strings.Builder
	// send lag: the load generator's p90 delay from a request's trace time
	// to its send (wall ms); past ~100 ms this process was starved of CPU
	// and the row's latencies say more about the machine than the policy.
	sb.WriteString("| workload | policy | completed | cached share | TTFT p50 s | TTFT p95 s | TTFT p99 s | output tok/s | replicas used | max/mean load | prompt drift | wall s | send lag p90 ms |\n")
	sb.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		lag := 0.0
		if r.Report != nil {
			lag = r.Report.QueueDelay.P90
		}
		fmt.Fprintf(&sb, "| %s | %s | %d/%d | %.1f%% | %.2f | %.2f | %.2f | %.0f | %d | %.2f | %+.2f%% | %.0f | %.0f |\n",
			r.Workload, r.Policy, r.OK, r.Requests, 100*r.Cached, r.TTFTp50, r.TTFTp95, r.TTFTp99, r.OutputTPS,
			r.ReplicasUsed, r.MaxMeanLoad, 100*r.DensityDrift, r.WallSeconds, lag)
	}
	for _, r := range rows {
		p := r.Preflight
		if p == nil || p.Sent == 0 {
			continue
		}
		fmt.Fprintf(&sb, "\n%s/%s preflights: %d sent (wall time), mean %.0f ms, within 50 ms %.1f%%, 100 ms %.1f%%, 150 ms %.1f%%, 250 ms %.1f%%, 500 ms %.1f%%; fallbacks %v; late %v; decisions precise %d approximate %d; predicted %d, dropped %d; %d requests waited, mean %.0f ms (wall); routed on a cached message prefix %d, prefix checks agreed %d disagreed %d; wait rule: %d of %d precise decisions diverged from the estimate, %d requests not waited for\n",
			r.Workload, r.Policy, p.Sent, 1000*p.Sum/float64(p.Sent), 100*p.Within(.05), 100*p.Within(.1), 100*p.Within(.15),
			100*p.Within(.25), 100*p.Within(.5), p.Fallbacks, p.Late, p.Precise, p.Approx, p.Predicted, p.PredictionsDropped,
			p.Waited, 1000*p.WaitSum/float64(max(p.Waited, 1)), p.PrefixRouted, p.PrefixAgreed, p.PrefixDisagreed,
			p.Diverged, p.Checked, p.Unwaited)
	}
	for _, r := range rows {
		if p := r.Peer; p != nil {
			fmt.Fprintf(&sb, "\n%s/%s (fleetsim's policy in Caddy): %d requests tokenized, %d picks, %d not routed by it, %d KV events applied, in flight at the end %v\n",
				r.Workload, r.Policy, p.Requests, p.Picks, p.Fallbacks, p.KVEvents, p.InFlight)
		}
	}
	return sb.String()
}
