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
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "restart:", err)
		os.Exit(1)
	}
}

// The arms: no restart, a restart without the snapshot, a restart with it.
const (
	armNone     = "none"
	armCold     = "cold"
	armSnapshot = "snapshot"
)

var arms = []string{armNone, armCold, armSnapshot}

// Row is one (workload, seed, arm) run.
type Row struct {
	Workload string `json:"workload"`
	Seed     uint64 `json:"seed"`
	Arm      string `json:"arm"`
	// RestartAt is when the restart began (the switch held new requests),
	// in simulated seconds since the start of the run; for "none" the
	// same point without a restart.
	RestartAt float64 `json:"restart_at_s"`
	// Downtime is how long the switch held new requests (wall seconds):
	// draining the requests in flight, the clean stop (which writes the
	// snapshot) and the start (which reads it).
	Downtime float64 `json:"downtime_wall_s"`
	// Requests completed and Failed of those sent in the window; Share is
	// cached / prompt tokens over the completed ones.
	Requests int     `json:"requests"`
	Failed   int     `json:"failed"`
	Share    float64 `json:"cached_share"`
	// SnapshotBytes is the snapshot file the clean stop wrote, Loaded
	// whether the new Caddy loaded it (ramjet_snapshot_loads_total).
	SnapshotBytes int64 `json:"snapshot_bytes,omitempty"`
	Loaded        bool  `json:"snapshot_loaded,omitempty"`
	// FirstError is the first failure in the window.
	FirstError string `json:"first_error,omitempty"`
	// After is the cached share over the window's requests sent after
	// the new Caddy was up (the requests held during the restart left
	// out: they reach it at once, a burst "none" does not have).
	After      float64 `json:"cached_share_after_resume"`
	AfterCount int     `json:"requests_after_resume"`
	// Before is the cached share over everything sent before RestartAt.
	Before float64 `json:"cached_share_before"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("restart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		workloads = fs.String("workload", "shared-prefix,locality", "workloads, comma-separated ("+strings.Join(workload.Names, ", ")+")")
		armsS     = fs.String("arms", strings.Join(arms, ","), "arms, comma-separated: none, cold, snapshot")
		seedsS    = fs.String("seeds", "1,2,3", "workload seeds, comma-separated")
		replicas  = fs.Int("replicas", 8, "engine simulators")
		scale     = fs.Float64("scale", 1, "workload request-count scale (the fleet simulation's -scale)")
		timeScale = fs.Float64("time-scale", 10, "engines and trace run this much faster than real time")
		at        = fs.Float64("at", 1.0/3, "restart at this fraction of the trace's last arrival")
		window    = fs.Duration("window", time.Minute, "the measured window after the restart (simulated time)")
		drain     = fs.Duration("drain", time.Minute, "after the window, wait at most this long (simulated) for its requests to complete")
		history   = fs.String("history", "actual", "later turns carry the engine's actual reply or a synthetic stand-in")
		timeout   = fs.Duration("timeout", 2*time.Minute, "per-request timeout (wall)")
		asJSON    = fs.Bool("json", false, "print JSON rows instead of Markdown tables")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	hist, err := loadgen.ParseHistoryMode(*history)
	if err != nil {
		return err
	}
	var seeds []uint64
	for _, s := range strings.Split(*seedsS, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return fmt.Errorf("-seeds: %w", err)
		}
		seeds = append(seeds, v)
	}
	var armList []string
	for _, a := range strings.Split(*armsS, ",") {
		a = strings.TrimSpace(a)
		if !slices.Contains(arms, a) {
			return fmt.Errorf("-arms: unknown arm %q", a)
		}
		armList = append(armList, a)
	}
	if *replicas < 1 || *timeScale <= 0 || *at <= 0 || *at >= 1 || *window <= 0 {
		return errors.New("-replicas, -time-scale and -window must be positive, -at in (0,1)")
	}
	o := opts{n: *replicas, ts: *timeScale, window: window.Seconds(), drain: drain.Seconds(), hist: hist, timeout: *timeout}
	var rows []Row
	for _, name := range strings.Split(*workloads, ",") {
		name = strings.TrimSpace(name)
		for _, seed := range seeds {
			w, err := workload.Generate(name, workload.Options{Seed: seed, Replicas: *replicas, Scale: *scale})
			if err != nil {
				return err
			}
			last := 0.0
			for _, r := range w.Trace {
				last = max(last, r.At)
			}
			for _, arm := range armList {
				fmt.Fprintf(stderr, "restart: %s seed %d, %s (%d requests, restart at %.0fs simulated)\n", name, seed, arm, len(w.Trace), last**at)
				row, err := runArm(ctx, w, arm, seed, last**at, o)
				if err != nil {
					return fmt.Errorf("%s/%d/%s: %w", name, seed, arm, err)
				}
				if row.Failed > 0 {
					fmt.Fprintf(stderr, "restart: %d requests of the window failed, the first: %s\n", row.Failed, row.FirstError)
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
	fmt.Fprintf(stdout, "replicas=%d scale=%g time-scale=%g at=%g window=%s history=%s\n\n", *replicas, *scale, *timeScale, *at, *window, hist)
	fmt.Fprint(stdout, markdown(rows, armList))
	return nil
}

// opts are a run's settings.
type opts struct {
	n             int
	ts            float64
	window, drain float64 // simulated seconds
	hist          loadgen.HistoryMode
	timeout       time.Duration
}

// benchKey is the snapshot key of the runs (a bench, not a secret).
const benchKey = "restart-bench-snapshot-key-0123456789"

const engineModel = "sim"

// sent is what the window needs of one result.
type sent struct {
	at             time.Duration // since the run's start, wall
	ok             bool
	err            string
	prompt, cached int
}

// runArm replays w through a switch in front of Caddy with lb_policy
// ramjet in front of fresh engines, restarting Caddy at simulated time at
// as arm says, and measures the window after it.
func runArm(ctx context.Context, w *workload.Workload, arm string, seed uint64, at float64, o opts) (Row, error) {
	sims := make([]*enginesim.Server, 0, o.n)
	defer func() {
		for _, s := range sims {
			s.Close()
		}
	}()
	addrs := make([]string, 0, o.n)
	for i := range o.n {
		s, err := enginesim.Start(ctx, enginesim.Options{Model: engineModel, TimeScale: o.ts, Seed: uint64(i) + 1,
			Engine: engine.Config{MaxModelLen: 131072}})
		if err != nil {
			return Row{}, err
		}
		sims = append(sims, s)
		addrs = append(addrs, s.Addr())
	}
	dir, err := os.MkdirTemp("", "ramjet-restart-")
	if err != nil {
		return Row{}, err
	}
	defer os.RemoveAll(dir)
	snapPath := filepath.Join(dir, "index.snap")
	site := caddyrun.RamjetSite("lb", "ramjet", addrs)
	if arm == armSnapshot {
		site.PolicyConfig = map[string]any{"snapshot": map[string]any{"path": snapPath, "key": benchKey, "interval": "1h"}}
	}
	running, err := caddyrun.Start([]caddyrun.Site{site})
	if err != nil {
		return Row{}, err
	}
	up := true
	defer func() {
		if up {
			caddyrun.Stop()
		}
	}()
	sw, err := startSwitch(running.Addr["lb"])
	if err != nil {
		return Row{}, err
	}
	defer sw.Close()
	client, err := loadgen.NewClient(loadgen.ClientConfig{BaseURL: sw.URL(), Model: engineModel, Timeout: o.timeout,
		UpstreamHeader: caddyrun.SpreadHeader, IgnoreEOS: true})
	if err != nil {
		return Row{}, err
	}
	defer client.Close()

	var mu sync.Mutex
	var got []sent
	var sends []time.Duration          // every request's Sent, as it is sent
	recorded := make(chan struct{}, 1) // signalled (coalesced) on every result
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		rep *loadgen.Report
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		rep, err := loadgen.Run(runCtx, loadgen.RunConfig{
			Label: w.Name + "/" + arm, Trace: w.Trace, Client: client,
			Synth: loadgen.Synthesizer{Synth: workload.Synth{Salt: seed}, History: o.hist},
			Mode:  loadgen.ModeOpen, Concurrency: 1024, TimeScale: o.ts,
			Results: func(r *loadgen.Result) {
				mu.Lock()
				got = append(got, sent{at: r.Sent, ok: r.OK(), err: string(r.Err) + ": " + r.ErrMsg, prompt: r.PromptTokens, cached: r.CachedTokens})
				mu.Unlock()
				select {
				case recorded <- struct{}{}:
				default:
				}
			},
			Sending: func(at time.Duration) {
				mu.Lock()
				sends = append(sends, at)
				mu.Unlock()
			},
		})
		done <- result{rep, err}
	}()
	wall := func(sim float64) time.Duration { return time.Duration(sim / o.ts * float64(time.Second)) }

	row := Row{Workload: w.Name, Seed: seed, Arm: arm}
	var restartErr error
	select {
	case <-time.After(time.Until(start.Add(wall(at)))):
	case r := <-done:
		return Row{}, fmt.Errorf("the run ended before the restart (%v)", r.err)
	}
	p := time.Since(start)
	resumed := p
	row.RestartAt = p.Seconds() * o.ts
	loads0 := snapshotLoads()
	if arm != armNone {
		sw.Hold()
		if err := caddyrun.Stop(); err != nil {
			restartErr = fmt.Errorf("stop: %w", err)
		}
		up = false
		if st, err := os.Stat(snapPath); err == nil {
			row.SnapshotBytes = st.Size()
		}
		if restartErr == nil {
			running, err = caddyrun.Start([]caddyrun.Site{site})
			if err != nil {
				restartErr = fmt.Errorf("start: %w", err)
			} else {
				up = true
				sw.Resume(running.Addr["lb"])
			}
		}
		if restartErr != nil {
			sw.Resume(running.Addr["lb"]) // let the held requests fail rather than hang
		}
		resumed = time.Since(start)
		row.Downtime = (resumed - p).Seconds()
	}
	end := p + wall(o.window)
	// Once the window has ended and the new Caddy is up (on a loaded
	// machine the restart can outlast the window), wait for every request
	// sent in the window to complete, at most the drain. The trace goes on
	// meanwhile, outside the window.
	settled := func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, at := range sends {
			if at < end {
				n++
			}
		}
		for _, s := range got {
			if s.at < end {
				n--
			}
		}
		return n <= 0 // a request that failed before its send has a result and no send
	}
	var r result
	finished := false
	select {
	case <-time.After(time.Until(start.Add(max(end, resumed)))):
	case r = <-done:
		finished = true
	}
	deadline := time.NewTimer(time.Until(start.Add(max(end, resumed) + wall(o.drain))))
	for !finished && !settled() {
		select {
		case <-recorded:
		case <-deadline.C:
			cancel() // the window's requests had the drain
		case r = <-done:
			finished = true
		}
	}
	deadline.Stop()
	if !finished {
		cancel() // the window's requests are answered
		r = <-done
	}
	if restartErr != nil {
		return Row{}, restartErr
	}
	if r.err != nil {
		return Row{}, r.err
	}
	row.Loaded = snapshotLoads() > loads0 // applied at the new Caddy's first request
	mu.Lock()
	defer mu.Unlock()
	var prompt, cached, bp, bc, ap, ac int
	for _, s := range got {
		switch {
		case s.at < p && s.ok:
			bp += s.prompt
			bc += s.cached
		case s.at >= p && s.at < end && s.ok:
			row.Requests++
			prompt += s.prompt
			cached += s.cached
			if s.at >= resumed {
				row.AfterCount++
				ap += s.prompt
				ac += s.cached
			}
		case s.at >= p && s.at < end:
			row.Failed++
			if row.Failed == 1 {
				row.FirstError = s.err
			}
		}
	}
	row.Share = ratio(cached, prompt)
	row.Before = ratio(bc, bp)
	row.After = ratio(ac, ap)
	return row, nil
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// markdown renders every run, then the median (min-max) over the seeds
// per workload and arm.
func markdown(rows []Row, armList []string) string {
	var b strings.Builder
	b.WriteString("| workload | seed | arm | restart at (sim s) | downtime (wall s) | requests in the window | failed | cached share before | cached share in the window | of them sent after the restart: requests, cached share | snapshot bytes | loaded |\n")
	b.WriteString("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %s | %.1f | %.2f | %d | %d | %.3f | %.3f | %d, %.3f | %d | %t |\n",
			r.Workload, r.Seed, r.Arm, r.RestartAt, r.Downtime, r.Requests, r.Failed, r.Before, r.Share, r.AfterCount, r.After, r.SnapshotBytes, r.Loaded)
	}
	b.WriteString("\nMedian (min-max) over the seeds, cached share of the window:\n\n| workload |")
	for _, a := range armList {
		fmt.Fprintf(&b, " %s |", a)
	}
	b.WriteString("\n|---|" + strings.Repeat("---:|", len(armList)) + "\n")
	var names []string
	for _, r := range rows {
		if !slices.Contains(names, r.Workload) {
			names = append(names, r.Workload)
		}
	}
	for _, after := range []bool{false, true} {
		for _, n := range names {
			label := n
			if after {
				label += ", sent after the restart"
			}
			fmt.Fprintf(&b, "| %s |", label)
			for _, a := range armList {
				var xs []float64
				for _, r := range rows {
					if r.Workload == n && r.Arm == a {
						xs = append(xs, map[bool]float64{false: r.Share, true: r.After}[after])
					}
				}
				fmt.Fprintf(&b, " %s |", fleetsim.SpreadOf(xs).Format(3))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
