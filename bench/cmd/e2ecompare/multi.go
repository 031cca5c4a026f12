package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/enginesim"
	"github.com/ramjet-llm/ramjet/bench/loadgen"
	"github.com/ramjet-llm/ramjet/bench/loadgen/caddyrun"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/module"
)

// multiRouteIDSecret is the route-id secret every instance shares (as
// several ramjet instances of one deployment must).
const multiRouteIDSecret = "e2ecompare-multi"

// multiSites returns k ramjet sites over upstreams, each an independent
// instance: its own state_key (own index, own reservations, as a separate
// Caddy process has), the same route-id secret, the observer handler of
// its own state. capacity > 0 is every instance's kv_capacity (the
// engines' KV capacity in tokens, as siteFor gives the single-instance
// rows and the fleet simulation's instances know it); 0 leaves it unknown
// (ramjet-nocap). em > 0 turns on every instance's engine_metrics at that
// interval (engine-reported load: the spill band's and foreign_prefill's
// defaults with kv); foreign, when not empty, is every instance's
// foreign_prefill (on, off or queues).
func multiSites(k int, upstreams []string, kv map[string]any, capacity int, em time.Duration, foreign string) []caddyrun.Site {
	sites := make([]caddyrun.Site, k)
	for i := range sites {
		key := fmt.Sprintf("e2e-r%d", i)
		sites[i] = caddyrun.Site{
			Name: fmt.Sprintf("r%d", i), Policy: "ramjet", Upstreams: upstreams,
			PolicyConfig: map[string]any{"state_key": key, "route_id_secret": multiRouteIDSecret,
				// The instances share a host: name them (spill positions).
				"instance_id": fmt.Sprintf("ramjet-%d", i)},
			Handlers: []map[string]any{{"handler": "ramjet_observe", "state_key": key}},
		}
		if kv != nil {
			sites[i].PolicyConfig["kv"] = kv
		}
		if capacity > 0 {
			sites[i].PolicyConfig["kv_capacity"] = capacity
		}
		if foreign != "" {
			sites[i].PolicyConfig["foreign_prefill"] = foreign
		}
		if em > 0 {
			sites[i].PolicyConfig["engine_metrics"] = map[string]any{"interval": int64(em)}
		}
	}
	return sites
}

// multiOpts are runMulti's instances: with bin set (-procs) separate
// Caddy processes of that binary (startProcsAdmin), else sites of the
// in-process Caddy; with precise every instance subscribes to every
// engine's KV events (the precise path), with tokTO > 0 as its tokenize
// preflight's timeout; with nocap the instances are not told the engines'
// KV capacity (ramjet-nocap; every -routers row before 2026-12-05 21:30);
// em and foreign as multiSites takes them; results, when set, receives
// every request's result (-results); settings are the -routers-policy
// target's options (parseRoutersTarget), set in every instance's policy,
// and name, when set, the target's name (the rows' policy); tok is the
// engines' tokenizer (-density).
type multiOpts struct {
	tok            engine.Tokenizer
	bin            string
	precise, nocap bool
	em, tokTO      time.Duration
	foreign        string
	results        func(*loadgen.Result)
	name           string
	settings       map[string]any
}

// runMulti replays w through k ramjet instances (sites of one in-process
// Caddy with separate state, see multiSites, or processes: multiOpts)
// behind a loadgen.Front with policy front, in front of n fresh engine
// simulators.
func runMulti(ctx context.Context, w *workload.Workload, k int, front loadgen.FrontPolicy, n, kvCapacity int, seed uint64, ts float64,
	hist loadgen.HistoryMode, timeout, maxDur time.Duration, o multiOpts, progress, logw io.Writer) (Row, error) {
	bin, precise := o.bin, o.precise
	sims, addrs, err := startEngines(ctx, w, n, kvCapacity, ts, o.tok, precise)
	defer closeEngines(sims)
	if err != nil {
		return Row{}, err
	}
	sites, pol := multiSitesFor(k, sims, addrs, o)
	var backends []string
	var procsKV *procs
	var inproc *caddyrun.Running
	label := fmt.Sprintf("%s x%d %s", pol, k, front)
	if bin != "" {
		// With precise, each process's admin endpoint is on so that its
		// precise/approximate decisions and applied KV events are read
		// before it stops (procKV).
		ps, err := startProcsAdmin(ctx, bin, sites, precise)
		if err != nil {
			return Row{}, err
		}
		defer func() {
			if err := ps.stop(); err != nil {
				fmt.Fprintf(logw, "e2ecompare: %s: %v\n", label, err)
			}
		}()
		backends = ps.addrs
		label = fmt.Sprintf("%s x%d procs %s", pol, k, front)
		procsKV = ps
	} else {
		running, err := caddyrun.Start(append(slices.Clip(sites), metricsSite(addrs)))
		if err != nil {
			return Row{}, err
		}
		defer caddyrun.Stop()
		for _, s := range sites {
			backends = append(backends, running.Addr[s.Name])
		}
		inproc = running
	}
	fr, err := loadgen.StartFront(backends, front, seed)
	if err != nil {
		return Row{}, err
	}
	defer fr.Close()

	client, err := loadgen.NewClient(loadgen.ClientConfig{
		BaseURL: fr.URL(), Model: engineModel, Timeout: timeout,
		UpstreamHeader: caddyrun.SpreadHeader, IgnoreEOS: true,
	})
	if err != nil {
		return Row{}, err
	}
	defer client.Close()
	start := time.Now()
	rep, err := loadgen.Run(ctx, loadgen.RunConfig{
		Label: w.Name + "/" + label, Trace: w.Trace, Client: client,
		Synth: loadgen.Synthesizer{Synth: workload.Synth{Salt: seed}, History: hist, Tokenizer: o.tok},
		Mode:  loadgen.ModeOpen, Concurrency: 1024, TimeScale: ts, MaxDuration: maxDur,
		Progress: progress, Results: o.results,
	})
	if err != nil {
		return Row{}, err
	}
	if n, last := fr.Errors(); n > 0 {
		fmt.Fprintf(logw, "e2ecompare: %s: the front saw %d proxy errors, last: %s\n", label, n, last)
	}
	if rep.Failed > 0 || rep.NotSent > 0 {
		fmt.Fprintf(logw, "e2ecompare: %s: %d failed, %d not sent: %v %q\n", label, rep.Failed, rep.NotSent, rep.Errors, rep.ErrorSamples)
	}
	row := reportRow(w.Name, label, n, ts, rep, time.Since(start))
	row.Front = fr.Counts()
	if inproc != nil {
		if row.KV, err = scrapeRouting(inproc); err != nil {
			return Row{}, fmt.Errorf("metrics: %w", err)
		}
		fmt.Fprintf(logw, "e2ecompare: %s/%s: %s\n", w.Name, label, row.KV)
	}
	if precise && bin == "" {
		// In one process each instance's preflight record is its state
		// key's: how many of its requests the wait rule routed at once.
		for i := range sites {
			if r, ok := module.KVPreflight(fmt.Sprintf("e2e-r%d", i)); ok {
				fmt.Fprintf(logw, "e2ecompare: %s/%s instance %d: preflights %d sent, %d waited, %d not waited for; decisions precise %d approximate %d\n",
					w.Name, label, i, r.Sent, r.Waited, r.Unwaited, r.Precise, r.Approx)
			}
		}
	}
	if procsKV != nil {
		for i, a := range procsKV.admins {
			lines, err := scrapeKV("http://" + a)
			if err != nil {
				fmt.Fprintf(logw, "e2ecompare: %s: instance %d metrics: %v\n", label, i, err)
				continue
			}
			s := summarizeKV(lines)
			fmt.Fprintf(logw, "e2ecompare: %s/%s instance %d: %s\n", w.Name, label, i, s)
			row.InstanceKV = append(row.InstanceKV, s)
		}
	}
	return row, nil
}

// multiSitesFor returns runMulti's k instances over the engines sims at
// addrs (multiSites) and their policy's name: ramjet or ramjet-precise
// (o.precise), told the engines' KV capacity (engineCapacity) as siteFor's
// single-instance rows and the fleet simulation's instances are, or with
// o.nocap not (the name then ends in -nocap); o.settings set in each (a
// target's options), o.name the name when set.
func multiSitesFor(k int, sims []*enginesim.Server, addrs []string, o multiOpts) ([]caddyrun.Site, string) {
	var kv map[string]any
	pol, capacity := "ramjet", engineCapacity(sims)
	if o.precise {
		kv, pol = kvConfig(sims, addrs, o.tokTO), "ramjet-precise"
	}
	if o.nocap {
		pol, capacity = pol+"-nocap", 0
	}
	sites := multiSites(k, addrs, kv, capacity, o.em, o.foreign)
	for _, s := range sites {
		applySettings(s.PolicyConfig, o.settings)
	}
	if o.name != "" {
		pol = o.name
	}
	return sites, pol
}

// parseRouters parses -routers and -front.
func parseRouters(routers, front string) ([]int, loadgen.FrontPolicy, error) {
	fp, err := loadgen.ParseFrontPolicy(front)
	if err != nil {
		return nil, 0, fmt.Errorf("-front: %w", err)
	}
	if routers == "" {
		return nil, fp, nil
	}
	var out []int
	for _, f := range strings.Split(routers, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			return nil, 0, fmt.Errorf("-routers %q: want positive counts, comma-separated", routers)
		}
		out = append(out, k)
	}
	return out, fp, nil
}

// summarizeKV condenses scrapeKV's lines of one process into one line:
// each series summed over its labels except mode and reason (the
// per-engine feed series become one figure), in first-seen order, e.g.
// "kv_decisions_total{mode=precise}=812 kv_events_applied_total=4410".
func summarizeKV(lines []string) string {
	var keys []string
	sum := map[string]float64{}
	for _, l := range lines {
		sp := strings.LastIndexByte(l, ' ')
		if sp < 0 || strings.HasPrefix(l, "#") {
			continue
		}
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			continue
		}
		name, labels, _ := strings.Cut(l[:sp], "{")
		key := strings.TrimPrefix(name, "ramjet_")
		for _, lv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if k, val, ok := strings.Cut(lv, "="); ok && (k == "mode" || k == "reason") {
				key += "{" + k + "=" + strings.Trim(val, `"`) + "}"
			}
		}
		if _, seen := sum[key]; !seen {
			keys = append(keys, key)
		}
		sum[key] += v
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.FormatFloat(sum[k], 'f', -1, 64)
	}
	return strings.Join(parts, " ")
}
