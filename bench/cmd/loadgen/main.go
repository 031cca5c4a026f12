package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		baseURL     = fs.String("url", "http://127.0.0.1:8000/v1", "OpenAI API base URL of the endpoint")
		apiKey      = fs.String("api-key", os.Getenv("OPENAI_API_KEY"), "bearer token (default $OPENAI_API_KEY)")
		model       = fs.String("model", "sim", "model name sent with every request")
		traceFile   = fs.String("trace", "", "trace file: bench/workload JSONL or CSV, or a Mooncake-style JSONL trace (timestamp, input_length, output_length, hash_ids; see -trace-*); '-' reads stdin")
		wl          = fs.String("workload", "", "generate the named workload instead of reading a trace: "+strings.Join(workload.Names, ", "))
		seed        = fs.Uint64("seed", 1, "seed of -workload")
		scale       = fs.Float64("scale", 1, "request-count scale of -workload")
		replicas    = fs.Int("replicas", 8, "fleet size the -workload rates are scaled to")
		modeS       = fs.String("mode", "open", "open: trace arrival times; closed: -concurrency agents, arrival times ignored")
		conc        = fs.Int("concurrency", 0, "requests in flight at most (agents in closed mode); default 256 open, 8 closed")
		timeScale   = fs.Float64("time-scale", 1, "divide trace times (arrivals, think times) by this")
		historyS    = fs.String("history", "actual", "what later turns carry as earlier replies: actual (the engine's reply) or synthetic (deterministic stand-in)")
		salt        = fs.Uint64("salt", 0, "synthesis salt: different salts share no prompt text (default: -seed)")
		timeout     = fs.Duration("timeout", 5*time.Minute, "per-request timeout")
		maxDur      = fs.Duration("max-duration", 0, "stop the run after this long (0: none)")
		upHeader    = fs.String("upstream-header", loadgen.DefaultUpstreamHeader, "response header that names the replica")
		ignoreEOS   = fs.Bool("ignore-eos", true, `send "ignore_eos": true so engines generate exactly the trace's output length`)
		asJSON      = fs.Bool("json", false, "print the report as JSON instead of a table")
		outFile     = fs.String("out", "", "write every request's result as JSONL to this file")
		tokenize    = fs.Bool("tokenize", false, "calibrate the chat-template overhead with a bounded /tokenize preflight")
		tokenizeURL = fs.String("tokenize-url", "", "server root for /tokenize (default: -url without its /v1)")
		gateMedian  = fs.Float64("gate-median", 0.05, "fail when |median prompt-token drift| exceeds this fraction")
		gateP95     = fs.Float64("gate-p95", 0.15, "fail when p95 |prompt-token drift| exceeds this fraction")
		noGate      = fs.Bool("no-gate", false, "report the density drift without failing on it")
		maxErrRate  = fs.Float64("max-error-rate", 0.01, "fail when more than this fraction of the trace failed or was not sent")
		progress    = fs.String("progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), on, off")
	)
	var mo workload.MooncakeOptions
	mo.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	mode, err := loadgen.ParseMode(*modeS)
	if err != nil {
		return err
	}
	hist, err := loadgen.ParseHistoryMode(*historyS)
	if err != nil {
		return err
	}
	tr, label, err := loadTrace(*traceFile, *wl, workload.Options{Seed: *seed, Scale: *scale, Replicas: *replicas}, mo)
	if err != nil {
		return err
	}
	if len(tr) == 0 {
		return errors.New("the trace is empty")
	}
	if *salt == 0 {
		*salt = *seed
	}
	client, err := loadgen.NewClient(loadgen.ClientConfig{
		BaseURL: *baseURL, APIKey: *apiKey, Model: *model, Timeout: *timeout,
		UpstreamHeader: *upHeader, IgnoreEOS: *ignoreEOS,
	})
	if err != nil {
		return err
	}
	defer client.Close()
	synth := loadgen.Synthesizer{Synth: workload.Synth{Salt: *salt}, History: hist}

	var over loadgen.Overhead
	if *tokenize {
		root := *tokenizeURL
		if root == "" {
			root = strings.TrimSuffix(strings.TrimSuffix(*baseURL, "/"), "/v1")
		}
		over, err = loadgen.Calibrate(ctx, &http.Client{Timeout: 30 * time.Second}, root, *model, synth, tr)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "loadgen: chat-template overhead %.1f + %.1f tokens/message (from /tokenize)\n", over.Fixed, over.PerMessage)
	}

	cfg := loadgen.RunConfig{
		Label: label, Trace: tr, Synth: synth, Client: client, Mode: mode,
		Concurrency: *conc, TimeScale: *timeScale, MaxDuration: *maxDur, Overhead: over,
	}
	switch *progress {
	case "on":
		cfg.Progress = stderr
	case "auto":
		if f, ok := stderr.(*os.File); ok && loadgen.IsTerminal(f) {
			cfg.Progress = stderr
		}
	case "off":
	default:
		return fmt.Errorf("-progress %q: want auto, on or off", *progress)
	}
	if *outFile != "" {
		f, err := os.Create(*outFile)
		if err != nil {
			return err
		}
		defer f.Close()
		enc := json.NewEncoder(f)
		var werr error
		cfg.Results = func(r *loadgen.Result) {
			if werr == nil {
				werr = enc.Encode(r)
			}
		}
		defer func() {
			if werr != nil {
				fmt.Fprintln(stderr, "loadgen: writing -out:", werr)
			}
		}()
	}

	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return errors.New("interrupted")
	}
	bad := rep.Failed + rep.NotSent
	if rate := float64(bad) / float64(rep.Requests); rate > *maxErrRate {
		return fmt.Errorf("%d of %d requests failed or were not sent (%.1f%% > -max-error-rate %.1f%%)", bad, rep.Requests, 100*rate, 100**maxErrRate)
	}
	if !*noGate {
		if err := (loadgen.Gate{MaxMedianDrift: *gateMedian, MaxP95Drift: *gateP95}).Check(rep.Density); err != nil {
			return err
		}
	}
	return nil
}

// loadTrace reads the trace file or generates the named workload.
func loadTrace(file, name string, o workload.Options, mo workload.MooncakeOptions) (workload.Trace, string, error) {
	switch {
	case file != "" && name != "":
		return nil, "", errors.New("give -trace or -workload, not both")
	case name != "":
		w, err := workload.Generate(name, o)
		if err != nil {
			return nil, "", err
		}
		return w.Trace, name, nil
	case file == "-":
		tr, err := workload.ReadWith(os.Stdin, mo)
		return tr, "stdin", err
	case file != "":
		f, err := os.Open(file)
		if err != nil {
			return nil, "", err
		}
		defer f.Close()
		tr, err := workload.ReadWith(f, mo)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", file, err)
		}
		return tr, file, nil
	}
	return nil, "", errors.New("give -trace FILE or -workload NAME")
}
