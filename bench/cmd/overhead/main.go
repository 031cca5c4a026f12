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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		os.Exit(1)
	}
}

// The targets' names.
const (
	nameDirect = "direct"
	nameRR     = "round_robin"
	nameRamjet = "ramjet"
	// ramjet's edge handlers in front of round_robin (-parts).
	nameRRGuard        = "round_robin+guard"
	nameRRGuardObserve = "round_robin+guard+observe"
	// round_robin behind a handler that busy-waits a fixed time (-spin).
	nameRRSpin = "round_robin+spin"
)

// partSites are the -parts sites: round_robin behind ramjet_guard, and
// behind ramjet_guard and ramjet_observe, in the order deploy/Caddyfile
// runs them in front of the ramjet policy. Between round_robin, them and
// ramjet, what each of guard, observer and policy costs shows apart.
func partSites(addrs []string) []caddyrun.Site {
	guard := map[string]any{"handler": "ramjet_guard", "upstreams": addrs}
	observe := map[string]any{"handler": "ramjet_observe"}
	return []caddyrun.Site{
		{Name: nameRRGuard, Policy: "round_robin", Upstreams: addrs, Handlers: []map[string]any{guard}},
		{Name: nameRRGuardObserve, Policy: "round_robin", Upstreams: addrs, Handlers: []map[string]any{guard, observe}},
	}
}

// allScenarios are the request shapes, by name.
var allScenarios = []scenario{
	{name: "small", promptBytes: 1 << 10, maxTokens: 1},
	{name: "long-256KiB", promptBytes: 256 << 10, maxTokens: 1},
	{name: "stream-64", promptBytes: 1 << 10, maxTokens: 64, stream: true},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("overhead", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		engines   = fs.Int("engines", 8, "instant engine simulators behind the proxies")
		concList  = fs.String("concurrency", "16", "closed-loop clients per measurement; a comma-separated list (1,16,32) measures each in turn, in one process")
		rounds    = fs.Int("rounds", 5, "interleaved rounds (every scenario x target once per round)")
		roundDur  = fs.Duration("round", 2*time.Second, "duration of one (scenario, target) measurement in a round")
		bodies    = fs.Int("bodies", 64, "distinct request bodies per scenario (distinct prefixes)")
		scenarios = fs.String("scenarios", "small,long-256KiB,stream-64", "scenarios to run")
		policy    = fs.String("ramjet-policy", "ramjet", "selection policy of target (c)")
		engineK   = fs.String("engine", "sim", "instant engines: sim (bench/enginesim Instant mode) or echo (an OpenAI-shaped responder that models nothing)")
		echoUsage = fs.String("echo-usage", "cached-zero", "the echo engine's usage object: cached-zero (prompt_tokens_details.cached_tokens 0 on every answer: ramjet's index relearns every prompt) or no-details (no prompt_tokens_details, vLLM's and SGLang's default)")
		only      = fs.String("targets", "direct,round_robin,ramjet", "targets to measure (a subset for profiling one of them: -targets ramjet -cpuprofile cpu.out, or "+nameRRGuard+" alone); -parts adds its two")
		spin      = fs.Duration("spin", 0, "also measure "+nameRRSpin+": round_robin behind a handler that busy-waits this long per request (e.g. 10us), to see what that much serial handler work costs in req/s, p50 and CPU (at c=1 several times itself)")
		parts     = fs.Bool("parts", false, "also measure ramjet's edge handlers in front of round_robin: "+nameRRGuard+" (ramjet_guard) and "+nameRRGuardObserve+" (ramjet_guard, ramjet_observe), to split ramjet's cost between the handlers and the policy")
		asJSON    = fs.Bool("json", false, "print the rows as JSON instead of a Markdown table")
		cpuProf   = fs.String("cpuprofile", "", "write a CPU profile of the whole process (proxies, engines and clients) over the measured rounds to this file")
		memProf   = fs.String("memprofile", "", "write an allocation profile (alloc_space/alloc_objects since the start) to this file at the end")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var concs []int
	for _, f := range strings.Split(*concList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-concurrency %q: want positive integers separated by commas", *concList)
		}
		concs = append(concs, n)
	}
	if *echoUsage != "cached-zero" && *echoUsage != "no-details" {
		return fmt.Errorf("-echo-usage %q: want cached-zero or no-details", *echoUsage)
	}
	if *engines < 1 || *rounds < 1 || *roundDur <= 0 || *bodies < 1 {
		return errors.New("-engines, -concurrency, -rounds, -round and -bodies must be positive")
	}
	var scs []scenario
	for _, name := range strings.Split(*scenarios, ",") {
		found := false
		for _, sc := range allScenarios {
			if sc.name == strings.TrimSpace(name) {
				scs = append(scs, sc)
				found = true
			}
		}
		if !found {
			return fmt.Errorf("unknown scenario %q", name)
		}
	}

	const model = "sim"
	type instant interface {
		Addr() string
		URL() string
		Close() error
	}
	var sims []instant
	defer func() {
		for _, s := range sims {
			s.Close()
		}
	}()
	var addrs []string
	for range *engines {
		var s instant
		var err error
		switch *engineK {
		case "sim":
			s, err = enginesim.Start(ctx, enginesim.Options{
				Model: model, Instant: true,
				// 256 KiB prompts are 65536 tokens: raise the context limit.
				Engine: engine.Config{MaxModelLen: 1 << 17, MaxBatchedTokens: 1 << 17},
			})
		case "echo":
			s, err = startEcho(model, *echoUsage == "cached-zero")
		default:
			return fmt.Errorf("-engine %q: want sim or echo", *engineK)
		}
		if err != nil {
			return fmt.Errorf("start engine: %w", err)
		}
		sims = append(sims, s)
		addrs = append(addrs, s.Addr())
	}
	sites := []caddyrun.Site{
		{Name: nameRR, Policy: "round_robin", Upstreams: addrs},
		caddyrun.GuardedRamjetSite(nameRamjet, *policy, addrs),
	}
	targetNames := *only
	if *parts {
		targetNames += "," + nameRRGuard + "," + nameRRGuardObserve
	}
	// -targets may name a part alone (callgrind, one target per process).
	if names := strings.Split(targetNames, ","); slices.Contains(names, nameRRGuard) || slices.Contains(names, nameRRGuardObserve) {
		sites = append(sites, partSites(addrs)...)
	}
	if *spin < 0 {
		return errors.New("-spin must not be negative")
	}
	if *spin > 0 {
		sites = append(sites, caddyrun.Site{Name: nameRRSpin, Policy: "round_robin", Upstreams: addrs,
			Handlers: []map[string]any{{"handler": spinHandlerName, "duration": spin.String()}}})
		targetNames += "," + nameRRSpin
	}
	run, err := caddyrun.Start(sites)
	if err != nil {
		return err
	}
	defer caddyrun.Stop()

	var progress io.Writer
	if f, ok := stderr.(*os.File); ok && loadgen.IsTerminal(f) {
		progress = stderr
	}
	stopProfile, err := startProfiles(*cpuProf, *memProf)
	if err != nil {
		return err
	}
	var all []row
	for i, conc := range concs {
		var targets []target
		for _, t := range []target{
			{nameDirect, sims[0].URL() + "/v1"},
			{nameRR, run.URL(nameRR)},
			{nameRamjet, run.URL(nameRamjet)},
			{nameRRGuard, run.URL(nameRRGuard)},
			{nameRRGuardObserve, run.URL(nameRRGuardObserve)},
			{nameRRSpin, run.URL(nameRRSpin)},
		} {
			if _, ok := run.Addr[t.name]; !ok && t.name != nameDirect {
				continue
			}
			if slices.Contains(strings.Split(targetNames, ","), t.name) {
				targets = append(targets, t)
			}
		}
		if len(targets) == 0 {
			return fmt.Errorf("-targets %q: want a subset of direct,round_robin,ramjet (with -parts also %s,%s)", *only, nameRRGuard, nameRRGuardObserve)
		}
		b := &bench{
			targets:   targets,
			scenarios: scs, concurrency: conc, rounds: *rounds, round: *roundDur,
			bodies: *bodies, model: model, client: newHTTPClient(conc),
		}
		if err = b.run(ctx, progress); err != nil {
			break
		}
		rows := b.rows(nameDirect, nameRR, nameRamjet)
		all = append(all, rows...)
		if *asJSON {
			continue
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		engineDesc := *engineK
		if *engineK == "echo" {
			engineDesc += ", usage " + *echoUsage
		}
		fmt.Fprintf(stdout, "engines=%d (%s, instant) concurrency=%d rounds=%d x %s per cell, GOMAXPROCS=%d, %s/%s; (a) direct, (b) round_robin, (c) %s\n\n",
			*engines, engineDesc, conc, *rounds, *roundDur, runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, *policy)
		fmt.Fprint(stdout, markdown(rows, [3]string{nameDirect, nameRR, nameRamjet}))
		if *parts || *spin > 0 {
			fmt.Fprintln(stdout)
			fmt.Fprint(stdout, partsMarkdown(rows))
		}
		for _, r := range rows {
			for n, m := range r.Targets {
				if m.Errors > 0 {
					fmt.Fprintf(stdout, "\n%s via %s: %d errors, e.g. %s\n", r.Scenario, n, m.Errors, m.Sample)
				}
			}
		}
	}
	if perr := stopProfile(); err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(all)
	}
	return nil
}
