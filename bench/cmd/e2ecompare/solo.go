package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/workload"
)

// soloFlags are the flags of the separate-Caddy mode (-caddy-bin): each
// policy's Caddy runs as its own process while the engines and the load
// generator stay in this one, so that the router's CPU is measured (and
// profiled) apart from the engines'.
type soloFlags struct {
	bin  *string
	prof *time.Duration
}

func registerSolo(fs *flag.FlagSet) soloFlags {
	return soloFlags{
		bin:  fs.String("caddy-bin", "", "run each policy's Caddy as its own process of this binary (go build -o caddy ./xcaddy), the engines and load generator staying in this one; reports the Caddy process's CPU"),
		prof: fs.Duration("caddy-profile-chunk", 10*time.Second, "with -caddy-bin and -cpuprofile: the Caddy process is profiled in chunks of this length, one file each"),
	}
}

// adminListener binds a 127.0.0.1 listener (port chosen by the kernel)
// for a child's admin endpoint and returns it as a file to hand over, with
// its address; the caller closes the file once the child started.
func adminListener() (*os.File, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("admin listen: %w", err)
	}
	defer ln.Close() // the child holds its own copy
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return nil, "", fmt.Errorf("admin listener file: %w", err)
	}
	return f, ln.Addr().String(), nil
}

// withAdmin returns the Caddy JSON cfg with its admin endpoint on listen
// (caddyrun.Config disables it), so that /metrics and /debug/pprof answer.
func withAdmin(cfg []byte, listen string) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		return nil, fmt.Errorf("admin config: %w", err)
	}
	m["admin"] = map[string]any{"listen": listen, "config": map[string]any{"persist": false}}
	return json.Marshal(m)
}

// runSolo is runOne with the Caddy of pol in its own process of sf.bin:
// the row's CaddyCPUSeconds is that process's CPU time (user + system,
// from start to exit) and CPUSeconds, measured by the caller, is the
// engines' and load generator's. With prof (a -cpuprofile file name
// without extension) the Caddy process is profiled through its admin
// endpoint into <prof>-caddy-<k>.pprof, one file per chunk. The kv
// metrics the process exports are written to logw at the end.
func runSolo(ctx context.Context, w *workload.Workload, pol string, n, kvCapacity int, seed uint64, ts float64, tok engine.Tokenizer,
	hist loadgen.HistoryMode, timeout, maxDur, tokTO time.Duration, publish bool, progress io.Writer,
	sf soloFlags, prof, inst string, logw io.Writer) (Row, error) {
	sims, addrs, err := startEngines(ctx, w, n, kvCapacity, ts, tok, publish)
	defer closeEngines(sims)
	if err != nil {
		return Row{}, err
	}
	site := siteFor(pol, addrs, sims, tokTO, inst)
	ps, err := startProcsAdmin(ctx, *sf.bin, []caddyrun.Site{site}, true)
	if err != nil {
		return Row{}, err
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			if err := ps.stop(); err != nil {
				fmt.Fprintf(logw, "e2ecompare: %s: %v\n", pol, err)
			}
		}
	}
	defer stop()
	admin := "http://" + ps.admins[0]
	var profWG sync.WaitGroup
	profDone := make(chan struct{})
	if prof != "" {
		profWG.Add(1)
		go func() {
			defer profWG.Done()
			profileChunks(admin, prof, *sf.prof, profDone, logw)
		}()
	}

	client, err := loadgen.NewClient(loadgen.ClientConfig{
		BaseURL: "http://" + ps.addrs[0] + "/v1", Model: engineModel, Timeout: timeout,
		UpstreamHeader: caddyrun.SpreadHeader, IgnoreEOS: true,
	})
	if err != nil {
		close(profDone)
		profWG.Wait()
		return Row{}, err
	}
	defer client.Close()
	start := time.Now()
	rep, err := loadgen.Run(ctx, loadgen.RunConfig{
		Label: w.Name + "/" + pol + " (caddy process)", Trace: w.Trace, Client: client,
		Synth: loadgen.Synthesizer{Synth: workload.Synth{Salt: seed}, History: hist, Tokenizer: tok},
		Mode:  loadgen.ModeOpen, Concurrency: 1024, TimeScale: ts, MaxDuration: maxDur,
		Progress: progress,
	})
	wall := time.Since(start)
	close(profDone)
	profWG.Wait()
	if err != nil {
		return Row{}, err
	}
	if lines, err := scrapeKV(admin); err != nil {
		fmt.Fprintf(logw, "e2ecompare: %s: metrics: %v\n", pol, err)
	} else if len(lines) > 0 {
		fmt.Fprintf(logw, "e2ecompare: %s/%s caddy process metrics:\n  %s\n", w.Name, pol, strings.Join(lines, "\n  "))
	}
	stop()
	caddyCPU := 0.0
	if st := ps.cmds[0].ProcessState; st != nil {
		caddyCPU = (st.UserTime() + st.SystemTime()).Seconds()
	}
	row := reportRow(w.Name, pol+" (caddy process)", n, ts, rep, wall)
	row.CaddyCPUSeconds = caddyCPU
	return row, nil
}

// reportRow is the row of a run of w labelled policy over n replicas at
// time scale ts: the report's figures in simulated time.
func reportRow(wl, policy string, n int, ts float64, rep *loadgen.Report, wall time.Duration) Row {
	used := 0
	for up, c := range rep.Upstreams {
		if c > 0 && up != "(none)" {
			used++
		}
	}
	return Row{
		Workload: wl, Policy: policy,
		Requests: rep.Requests, OK: rep.Completed, Failed: rep.Failed, NotSent: rep.NotSent,
		Cached:  rep.CachedShare,
		TTFTp50: rep.TTFT.P50 / 1000 * ts, TTFTp95: rep.TTFT.P95 / 1000 * ts, TTFTp99: rep.TTFT.P99 / 1000 * ts,
		OutputTPS:    rep.OutputTokensPerSec / ts,
		ReplicasUsed: used, MaxMeanLoad: rep.SpreadOver(n),
		DensityDrift: rep.Density.MedianDrift,
		WallSeconds:  wall.Seconds(),
		Report:       rep,
	}
}

// profileChunks fetches CPU profiles of chunk length from the admin
// endpoint into <prefix>-caddy-<k>.pprof until done is closed (the chunk
// in progress then completes).
func profileChunks(admin, prefix string, chunk time.Duration, done <-chan struct{}, logw io.Writer) {
	secs := max(1, int(chunk/time.Second))
	hc := &http.Client{Timeout: chunk + 30*time.Second}
	for k := 0; ; k++ {
		select {
		case <-done:
			return
		default:
		}
		if err := fetchProfile(hc, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", admin, secs), fmt.Sprintf("%s-caddy-%d.pprof", prefix, k)); err != nil {
			fmt.Fprintf(logw, "e2ecompare: caddy profile %d: %v\n", k, err)
			return
		}
	}
}

func fetchProfile(hc *http.Client, url, path string) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// scrapeKV returns the precise path's preflight, decision and feed
// series of the Caddy process (ramjet_tokenize_*,
// ramjet_kv_decisions_total, ramjet_kv_events_applied_total,
// ramjet_kv_feed_connected, ramjet_kv_foreign_prefill_*, ramjet_kv_foreign_share), from its admin
// /metrics; histogram buckets left out.
func scrapeKV(admin string) ([]string, error) { return scrapeSeries(admin, kvSeries) }

// kvSeries reports whether a /metrics line is one of scrapeKV's.
func kvSeries(l string) bool {
	return (strings.HasPrefix(l, "ramjet_tokenize_") || strings.HasPrefix(l, "ramjet_kv_decisions_total") ||
		strings.HasPrefix(l, "ramjet_kv_events_applied_total") || strings.HasPrefix(l, "ramjet_kv_feed_connected") ||
		strings.HasPrefix(l, "ramjet_kv_foreign_prefill_") || strings.HasPrefix(l, "ramjet_kv_foreign_share")) && !strings.Contains(l, "_bucket{")
}

// scrapeSeries returns the lines of base's /metrics that keep selects.
func scrapeSeries(base string, keep func(string) bool) ([]string, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); keep(l) {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}
