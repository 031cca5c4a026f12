package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ramjet-llm/ramjet/bench/engine"
	"github.com/ramjet-llm/ramjet/bench/fleetsim"
	"github.com/ramjet-llm/ramjet/bench/workload"
	"github.com/ramjet-llm/ramjet/selection"
)

// multiArgs are the flags of the multi-router comparison (-routers).
type multiArgs struct {
	routers, front, policies string
	names                    []string
	traces                   []*workload.Workload
	replicas                 int
	scale                    float64
	parallel                 int
	seeds                    []uint64
	seedsS, preset           string
	rcfg                     selection.Config
	ecfg                     engine.Config
	jsonOut                  string
}

// runMulti runs fleetsim.RunMultiSeeds and prints one table per workload.
func runMulti(stdout io.Writer, a multiArgs) error {
	var routers []int
	for _, f := range strings.Split(a.routers, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			return fmt.Errorf("-routers %q: want positive counts, comma-separated", a.routers)
		}
		routers = append(routers, k)
	}
	front, err := fleetsim.ParseFront(a.front)
	if err != nil {
		return fmt.Errorf("-front: %w", err)
	}
	pols := fleetsim.MultiPolicyNames
	if a.policies != "all" {
		pols = strings.Split(a.policies, ",")
	}
	start := time.Now()
	out, err := fleetsim.RunMultiSeeds(fleetsim.MultiSuiteConfig{
		Workloads: a.names, Traces: a.traces, Policies: pols, Routers: routers, Front: front,
		Replicas: a.replicas, Scale: a.scale, Ramjet: a.rcfg, Engine: a.ecfg, Parallel: a.parallel,
		Progress: os.Stderr,
	}, a.seeds)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "engine: %s, KV capacity %d tokens per replica, max_num_seqs %d; seeds %s; front %s\n\n",
		a.preset, a.ecfg.CapacityTokens, a.ecfg.MaxRunningSeqs, a.seedsS, front)
	var all []fleetsim.MultiRow
	for _, wr := range out {
		title := fmt.Sprintf("%s, several routers (%s; %d requests; %d replicas; front %s; seeds %v)",
			wr.Workload.Name, wr.Workload.Summary, len(wr.Workload.Trace), wr.Rows[0].Replicas, front, a.seeds)
		fleetsim.WriteMultiTable(stdout, title, wr.Rows)
		all = append(all, wr.Rows...)
	}
	fmt.Fprintf(stdout, "suite wall time: %.1fs\n", time.Since(start).Seconds())
	if a.jsonOut != "" {
		return writeJSON(a.jsonOut, stdout, all)
	}
	return nil
}
