package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(1)
	}
}

// config is what the flags produce.
type config struct {
	opts     enginesim.Options
	fixtures string
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	o := &c.opts
	e := engine.DefaultConfig()
	fs := flag.NewFlagSet("enginesim", flag.ContinueOnError)
	fs.SetOutput(stderr)

	fs.StringVar(&o.Addr, "addr", "127.0.0.1:8000", "HTTP listen address")
	fs.StringVar(&o.AdminAddr, "admin-addr", "", "optional second listener for the /sim/* admin routes (stays up while connections are refused)")
	fs.StringVar(&o.Model, "model", "qwen3-32b", "served model name")
	fs.StringVar(&o.ModelRoot, "model-root", "/models/Qwen/Qwen3-32B", `"root" path reported by /v1/models`)
	fs.IntVar(&o.DP, "dp", 1, "data-parallel ranks behind the port (X-data-parallel-rank routes; none: least loaded)")
	fs.Float64Var(&o.TimeScale, "time-scale", 1, "simulated seconds per wall second (10 = ten times faster than real time)")
	fs.BoolVar(&o.Instant, "instant", false, "run engine steps back to back, ignoring the wall clock (overhead benchmarks)")
	fs.IntVar(&o.DefaultMaxTokens, "default-max-tokens", 128, "output tokens when a request gives no max_tokens")
	fs.Int64Var(&o.MaxBodyBytes, "max-body-bytes", 16<<20, "largest request body (413 past it)")
	fs.IntVar(&o.QueueFullStatus, "queue-full-status", 429, "status when the waiting queue is full: 429 or 503")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of fault draws")
	metricsFlavor := fs.String("metrics", "vllm", "/metrics dialect: vllm (vllm:* series) or sglang (sglang:* series)")

	fs.IntVar(&e.BlockSize, "block-size", e.BlockSize, "tokens per KV block")
	fs.IntVar(&e.CapacityTokens, "capacity-tokens", e.CapacityTokens, "KV cache capacity in tokens")
	fs.IntVar(&e.MaxRunningSeqs, "max-num-seqs", e.MaxRunningSeqs, "most sequences in a batch")
	fs.IntVar(&e.MaxWaiting, "max-waiting", e.MaxWaiting, "waiting queue bound per rank")
	fs.IntVar(&e.MaxModelLen, "max-model-len", e.MaxModelLen, "longest context (prompt + output) in tokens")
	fs.IntVar(&e.MaxBatchedTokens, "max-num-batched-tokens", e.MaxBatchedTokens, "chunked-prefill token budget per step")
	fs.DurationVar(&e.StepBase, "step-base", e.StepBase, "fixed cost of one forward pass")
	fs.DurationVar(&e.TokenCompute, "token-compute", e.TokenCompute, "compute cost per scheduled token")
	fs.DurationVar(&e.KVReadPerToken, "kv-read-per-token", e.KVReadPerToken, "decode cost per context token of each decoding sequence")
	fs.DurationVar(&e.PrefillAttnPerPair, "prefill-attn-per-pair", e.PrefillAttnPerPair, "prefill attention cost per (token, context position) pair")
	fs.IntVar(&e.SpecTokens, "spec-tokens", 0, "speculative draft length (0 = off)")
	fs.Float64Var(&e.SpecAcceptance, "spec-acceptance", 0.7, "per-token draft acceptance rate")
	fs.DurationVar(&e.SpecDraftCost, "spec-draft-cost", 1500*time.Microsecond, "cost of one draft position per step")
	fs.Uint64Var(&e.HashSeed, "hash-seed", 0, "block hash seed")
	fs.Uint64Var(&e.Seed, "engine-seed", 0, "seed of speculative acceptance draws")

	k := &o.KVEvents
	fs.StringVar(&k.Endpoint, "kv-events-endpoint", "", `KV event PUB bind address, e.g. "tcp://127.0.0.1:5557" (rank r binds port+r; empty = off)`)
	fs.StringVar(&k.ReplayEndpoint, "kv-replay-endpoint", "", "optional ROUTER bind address for replay requests (port offset by rank)")
	fs.StringVar(&k.Topic, "kv-topic", "", "topic frame of every KV event message")
	enc := fs.String("kv-encoding", "array", "KV event encoding: array (positional) or map")
	henc := fs.String("kv-hash-encoding", "uint", "block hash encoding: uint, int or bytes")
	fs.IntVar(&k.ReplayBuffer, "kv-replay-buffer", 10000, "batches kept for replay")

	f := &o.Faults
	fs.Float64Var(&f.ErrorRate, "fault-error-rate", 0, "share of requests answered with -fault-error-status")
	fs.IntVar(&f.ErrorStatus, "fault-error-status", 500, "status of injected errors")
	fs.DurationVar(&f.Latency, "fault-latency", 0, "latency added before a request reaches the engine")
	fs.BoolVar(&f.HangBeforeFirstToken, "fault-hang", false, "hang every request before its first token")
	fs.IntVar(&f.DieAfterTokens, "fault-die-after-tokens", 0, "drop the connection after this many tokens (0 = off)")
	fs.BoolVar(&f.RefuseConnections, "fault-refuse", false, "start with connections refused")
	specFault := fs.Float64("fault-spec-acceptance", -1, "report a collapsed speculative acceptance rate (negative = off)")

	fs.StringVar(&c.fixtures, "write-kv-fixtures", "", "write the deterministic KV event fixtures under this directory and exit")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	k.Encoding, k.HashEncoding = enginesim.KVEncoding(*enc), enginesim.HashEncoding(*henc)
	if *specFault >= 0 {
		f.SpecAcceptance = specFault
	}
	o.Metrics = enginesim.MetricsFlavor(*metricsFlavor)
	o.Engine = e
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if c.fixtures != "" {
		files, err := enginesim.WriteKVFixtures(c.fixtures)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %d fixture files under %s\n", len(files), c.fixtures)
		return nil
	}
	s, err := enginesim.Start(ctx, c.opts)
	if err != nil {
		return err
	}
	o := s.Options()
	fmt.Fprintf(stdout, "enginesim: model %s, %d rank(s), time scale %g, listening on %s\n", o.Model, o.DP, o.TimeScale, s.URL())
	if a := s.AdminURL(); a != "" {
		fmt.Fprintf(stdout, "enginesim: admin on %s\n", a)
	}
	for i, ep := range s.KVEndpoints() {
		fmt.Fprintf(stdout, "enginesim: rank %d KV events on %s (%s encoding)\n", i, ep, o.KVEvents.Encoding)
	}
	<-ctx.Done()
	return s.Close()
}
